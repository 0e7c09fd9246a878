"""Decode-only iterations from fixed-shape buffers, replayed as CUDA graphs.

An iteration without a prefill has one shape per (batch, fed width, key length): every sequence
feeds its block (one position more for Dream) and attends over its canvas. DecodeGraphs pads the
batch up to a power of two, the key length up to a power of two (>= MIN_KEYS), and computes the
attention metadata (PaddedBatch) on the device from four small inputs: token ids, positions, a
page table and canvas lengths. So only buffer contents change between iterations. On CUDA each
shape is captured on first use into a graph (all graphs share one memory pool) and then
replayed: one launch instead of hundreds of small kernels per layer. Elsewhere the same buffers
feed an eager forward, which is how the CPU tests check this path. All shapes of one block width
write their logits into one shared buffer (a graph's output would otherwise pin its own, about
1 GB each at batch 64 for a 126k vocabulary), and start-up captures only the shapes the KV pool
can hold.
"""
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
    """Device-side attention metadata of a padded decode batch: every key's slot from the page
    table, the key mask from the canvas lengths, every fed token's slot from its position."""
    kv_slots = page_table[:, key_pos // page_size] * page_size + key_pos % page_size
    kv_valid = key_pos.unsqueeze(0) < kv_len.unsqueeze(1)
    fed = positions.view(-1, width)
    write_slots = (torch.gather(page_table, 1, fed // page_size) * page_size + fed % page_size).view(-1)
    return PaddedBatch(page_table.shape[0], width, write_slots, kv_slots, kv_valid)


def capture_plan(max_len: int, max_batch: int, num_pages: int, page_size: int) -> list[tuple[int, int]]:
    """(batch, keys) buckets a decode batch can reach, largest first. Key bucket k holds canvases
    in (k/2, k] (the first one everything up to MIN_KEYS), batch bucket b holds b/2 + 1 to b
    sequences; a bucket is reachable when its smallest such batch fits the pool (the longest
    canvas's pages plus one page per other sequence) and its canvas fits the model."""
    def pages(tokens: int) -> int:
        return -(-tokens // page_size)
    longest = min(max_len, num_pages * page_size)
    keys = [MIN_KEYS << i for i in range(32) if MIN_KEYS << i <= pow2_at_least(longest, MIN_KEYS)]
    batches = [1 << i for i in range(32) if 1 << i <= pow2_at_least(max_batch)]
    plan = []
    for k in reversed(keys):
        shortest_longest = 1 if k == MIN_KEYS else k // 2 + 1
        for b in reversed(batches):
            if pages(shortest_longest) + b // 2 <= num_pages:      # b // 2 = (b // 2 + 1) - 1 others
                plan.append((b, k))
    return plan


@dataclass(slots=True)
class _Shape:
    batch: int
    width: int                  # fed tokens per sequence
    block: int                  # logit rows per sequence (width - lead)
    keys: int
    ids: torch.Tensor           # int64 [batch * width]
    positions: torch.Tensor     # int64 [batch * width]
    page_table: torch.Tensor    # int64 [batch, keys // page_size]; padding: the scratch page
    kv_len: torch.Tensor        # int64 [batch]
    rows: torch.Tensor          # int64 [batch * block]: logit rows of the packed stream
    key_pos: torch.Tensor       # int64 [keys]
    logits: torch.Tensor | None = None   # float32 [batch * block, vocab]: a view of the shared output
    graph: object | None = None


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, args: ModelArgs, pool: KVPool, device: torch.device,
                 max_batch: int, capture: bool, lead: int | None = None):
        self.model, self.args, self.pool, self.device = model, args, pool, device
        self.lead = args.logit_shift if lead is None else lead     # fed positions before the block (window_lead)
        self.max_batch = max_batch
        self.capture = capture and device.type == "cuda"
        self.shapes: dict[tuple[int, int, int], _Shape] = {}
        self.outputs: dict[int, torch.Tensor] = {}     # block width -> float32 [max batch * block, vocab]
        self.mempool = torch.cuda.graph_pool_handle() if self.capture else None

    @torch.inference_mode()
    def capture_all(self, block_length: int) -> int:
        """At start-up, like vLLM: every (batch, key) bucket of the default block width that the
        pool can hold (capture_plan), largest first so the shared pool is sized once and the first
        requests never wait on a capture. Other block widths are captured on first use. Returns the
        number of graphs."""
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
        """One host tensor per input (padding rows: the scratch page, one valid key), one copy each."""
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
        """What the graph records: metadata from the inputs, then the model."""
        batch = padded_metadata(s.page_table, s.kv_len, s.positions, s.key_pos, self.pool.page_size, s.width)
        logits = self.model(s.ids, s.positions, batch, self.pool.layers, s.rows)
        out = self.outputs[s.block][: s.batch * s.block]
        out.copy_(logits[:, : self.args.vocab_size])          # the float32 cast, into the shared buffer
        return out

    def _build(self, batch: int, width: int, keys: int) -> _Shape:
        dev = self.device
        block = width - self.lead
        if block not in self.outputs:    # outside any capture: an ordinary allocation, not the graph pool
            self.outputs[block] = torch.empty(pow2_at_least(self.max_batch) * block, self.args.vocab_size,
                                              dtype=torch.float32, device=dev)
        # as the runner's rows: block position j from fed row j + lead - shift, clamped to the window
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
                self._forward(s)               # warm-up: allocator and library workspaces
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the KV waiter thread may synchronise its own stream meanwhile.
            with torch.cuda.graph(graph, pool=self.mempool, capture_error_mode="thread_local"):
                s.logits = self._forward(s)
            s.graph = graph
        self.shapes[(batch, width, keys)] = s
        return s
