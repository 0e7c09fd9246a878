"""Decode-only iterations from fixed-shape buffers, replayed as CUDA graphs (docs/architecture.md,
"Decode-only iterations"). Elsewhere the same buffers feed an eager forward: how the CPU tests check this path."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.args import ModelArgs
from ..model.attention import PaddedBatch
from .kv_pool import KVPool

MIN_KEYS = 256


def pow2_at_least(n: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, n - 1).bit_length())


def padded_metadata(page_table: torch.Tensor, kv_len: torch.Tensor, positions: torch.Tensor,
                    key_pos: torch.Tensor, page_size: int, width: int) -> PaddedBatch:
    """Attention metadata of a padded decode batch, computed on the device from the four input buffers."""
    kv_slots = page_table[:, key_pos // page_size] * page_size + key_pos % page_size
    kv_valid = key_pos.unsqueeze(0) < kv_len.unsqueeze(1)
    fed = positions.view(-1, width)
    write_slots = (torch.gather(page_table, 1, fed // page_size) * page_size + fed % page_size).view(-1)
    return PaddedBatch(page_table.shape[0], width, write_slots, kv_slots, kv_valid)


def capture_plan(max_len: int, max_batch: int, num_pages: int, page_size: int) -> list[tuple[int, int]]:
    """(batch, keys) buckets whose smallest batch (b/2 + 1 canvases over k/2 keys) fits the pool, largest first."""
    def pages(tokens: int) -> int:
        return -(-tokens // page_size)
    longest = min(max_len, num_pages * page_size)
    keys = [MIN_KEYS << i for i in range(32) if MIN_KEYS << i <= pow2_at_least(longest, MIN_KEYS)]
    batches = [1 << i for i in range(32) if 1 << i <= pow2_at_least(max_batch)]
    plan = []
    for k in reversed(keys):
        shortest_longest = 1 if k == MIN_KEYS else k // 2 + 1
        for b in reversed(batches):
            if pages(shortest_longest) + b // 2 <= num_pages:
                plan.append((b, k))
    return plan


@dataclass(slots=True)
class _Shape:
    batch: int
    width: int
    block: int
    keys: int
    ids: torch.Tensor
    positions: torch.Tensor
    page_table: torch.Tensor
    kv_len: torch.Tensor
    rows: torch.Tensor
    key_pos: torch.Tensor
    logits: torch.Tensor | None = None
    graph: object | None = None


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, args: ModelArgs, pool: KVPool, device: torch.device,
                 max_batch: int, capture: bool, lead: int | None = None):
        self.model, self.args, self.pool, self.device = model, args, pool, device
        self.lead = args.logit_shift if lead is None else lead
        self.max_batch = max_batch
        self.capture = capture and device.type == "cuda"
        self.shapes: dict[tuple[int, int, int], _Shape] = {}
        self.outputs: dict[int, torch.Tensor] = {}     # per block width: a graph's own output would pin its own
        self.mempool = torch.cuda.graph_pool_handle() if self.capture else None

    @torch.inference_mode()
    def capture_all(self, block_length: int) -> int:
        """Capture the default width's reachable buckets, largest first so the shared pool is sized once."""
        width = block_length + self.lead
        for b, k in capture_plan(self.args.max_len, self.max_batch, self.pool.num_pages, self.pool.page_size):
            if (b, width, k) not in self.shapes:
                self._build(b, width, k)
        return len(self.shapes)

    def fits(self, items) -> bool:
        """Every item a dual-cache block step of one width, no more than max_batch of them."""
        if not items or len(items) > self.max_batch:
            return False
        lead = self.lead
        w = items[0].fed_end - items[0].fed_start
        return all(it.fed_end - it.fed_start == w and it.block_end - it.block_start == w - lead
                   and it.fed_start == it.block_start - lead for it in items)

    def run(self, items) -> torch.Tensor:
        """Block logits [len(items), block, vocab]: a view of a static buffer, valid until the next run."""
        n = len(items)
        width = items[0].fed_end - items[0].fed_start
        key = (pow2_at_least(n), width, pow2_at_least(max(it.canvas.numel() for it in items), MIN_KEYS))
        s = self.shapes.get(key) or self._build(*key)
        self._fill(s, items)
        if s.graph is not None:
            s.graph.replay()
        else:
            s.logits = self._forward(s)
        return s.logits[: n * s.block].view(n, s.block, -1)

    def _fill(self, s: _Shape, items) -> None:
        pad = s.batch - len(items)
        cols = -(-s.keys // self.pool.page_size)
        scratch = self.pool.scratch_page
        ids = torch.stack([it.canvas[it.fed_start:it.fed_end] for it in items]
                          + [torch.zeros(s.width, dtype=torch.int64)] * pad)
        starts = torch.tensor([it.fed_start for it in items] + [0] * pad)
        table = torch.tensor([it.alloc.pages + [scratch] * (cols - len(it.alloc.pages)) for it in items]
                             + [[scratch] * cols] * pad)
        kv_len = torch.tensor([it.canvas.numel() for it in items] + [1] * pad)
        positions = (starts.unsqueeze(1) + torch.arange(s.width)) * (torch.arange(s.batch) < len(items)).unsqueeze(1)
        for dst, src in ((s.ids, ids.view(-1)), (s.positions, positions.view(-1)), (s.page_table, table),
                         (s.kv_len, kv_len)):
            dst.copy_(src)

    def _forward(self, s: _Shape) -> torch.Tensor:
        batch = padded_metadata(s.page_table, s.kv_len, s.positions, s.key_pos, self.pool.page_size, s.width)
        logits = self.model(s.ids, s.positions, batch, self.pool.layers, s.rows)
        out = self.outputs[s.block][: s.batch * s.block]
        out.copy_(logits[:, : self.args.vocab_size])
        return out

    def _build(self, batch: int, width: int, keys: int) -> _Shape:
        dev = self.device
        block = width - self.lead
        if block not in self.outputs:    # outside any capture: an ordinary allocation, not the graph pool
            self.outputs[block] = torch.empty(pow2_at_least(self.max_batch) * block, self.args.vocab_size,
                                              dtype=torch.float32, device=dev)
        # as ModelRunner's rows: clamped to the window
        rows = (torch.arange(batch).unsqueeze(1) * width
                + (torch.arange(block) + self.lead - self.args.logit_shift).clamp_min(0)).view(-1)
        s = _Shape(batch, width, block, keys,
                   torch.zeros(batch * width, dtype=torch.int64, device=dev),
                   torch.zeros(batch * width, dtype=torch.int64, device=dev),
                   torch.full((batch, -(-keys // self.pool.page_size)), self.pool.scratch_page,
                              dtype=torch.int64, device=dev),
                   torch.ones(batch, dtype=torch.int64, device=dev), rows.to(dev),
                   torch.arange(keys, device=dev))
        if self.capture:   # the buffers point at the scratch page: warm-up and capture touch no live KV
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                self._forward(s)
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the KV waiter thread may synchronise its own stream meanwhile.
            with torch.cuda.graph(graph, pool=self.mempool, capture_error_mode="thread_local"):
                s.logits = self._forward(s)
            s.graph = graph
        self.shapes[(batch, width, keys)] = s
        return s
