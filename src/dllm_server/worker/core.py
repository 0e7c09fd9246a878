"""WorkerCore: one worker's iteration loop body, single-threaded and free of queues and sleeps.

`step()` seats decodes, asks the pure admission function which prefills go in, allocates their
pages, runs every admitted prefill and every seated decode in ONE packed forward, applies the
unmasking rule per block and returns the resulting messages. Pages are held for one block and
returned at block end, on abort and on error. The offline LLM drives it in-process; worker
processes drive it from their queues.
"""
from __future__ import annotations

import heapq
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..config import ServerConfig
from ..decoding import unmask
from ..decoding.canvas import num_blocks, steps_per_block, transfer_counts
from ..decoding.stop import is_final
from ..messages import Abort, BlockDone, LoadReport, PrefillDone, RequestFailed, StepDelta, SubmitBlock
from ..model.args import ModelArgs
from .admission import PrefillCandidate, admit, seat_decodes
from .cuda_graph import DecodeGraphs
from .kv_pool import KVPool, PageAlloc
from .kv_transfer import KVSender, SendItem, receiving_owner
from .runner import ForwardItem, ModelRunner, fed_range

log = logging.getLogger(__name__)


@dataclass(slots=True)
class BlockTask:
    """Worker-local state of one request's current block."""
    msg: SubmitBlock
    canvas: torch.Tensor
    start: int
    end: int
    stop_ids: torch.Tensor
    schedule: list[int] | None          # commits per step under the fixed-steps schedule
    alloc: PageAlloc | None = None
    step: int = 0                       # forwards done in this block

    @property
    def request_id(self) -> str:
        return self.msg.request_id


@dataclass(slots=True)
class IterationStats:
    prefill_tokens: int = 0
    decode_tokens: int = 0
    num_prefills: int = 0
    num_decodes: int = 0
    deficit_tokens: int = 0
    forward_s: float = 0.0


class _ForwardTimer:
    """Wall time of the forward on the CPU; on CUDA, device time between two events (the launch
    returns before the kernels run), read once the step's copy to the host has synchronised."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.end.record()
        else:
            self.t1 = time.perf_counter()

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3 if self.cuda else self.t1 - self.t0


@dataclass(slots=True)
class _Waiting:
    heap: list = field(default_factory=list)   # (arrival_seq, block_index, request_id)

    def push(self, t: BlockTask) -> None:
        heapq.heappush(self.heap, (t.msg.arrival_seq, t.msg.block_index, t.request_id))


class WorkerCore:
    def __init__(self, config: ServerConfig, model: torch.nn.Module, args: ModelArgs,
                 dtype: torch.dtype, device: torch.device, num_pages: int):
        self.config = config
        self.args = args
        self.pool = KVPool(args.num_layers, num_pages, config.page_size, args.num_kv_heads,
                           args.head_dim, dtype, device)
        graphs = None
        if device.type == "cuda" and not config.enforce_eager and not config.causal:
            graphs = DecodeGraphs(model, args, self.pool, device, config.max_active_decodes, capture=True)
            t0 = time.perf_counter()
            n = graphs.capture_all(config.block_length)
            log.info("captured %d decode CUDA graphs in %.1f s (%.2f GiB reserved)", n,
                     time.perf_counter() - t0, torch.cuda.memory_reserved(device) / 2**30)
        self.runner = ModelRunner(model, args, self.pool, device, causal=config.causal,
                                  attention_backend=config.attention_backend, decode_graphs=graphs)
        self.tasks: dict[str, BlockTask] = {}
        self.waiting = _Waiting()
        self.ready: list[str] = []           # prefilled, waiting for a decode seat (arrival order)
        self.active: list[str] = []          # seated decodes
        self.deficit_tokens = 0
        self.last = IterationStats()
        self.num_forwards = 0
        # Set by a worker process in a torch.distributed group: the KV sender, and how to put
        # messages out at once (a streamed group's KVSent must leave before its data flows).
        self.sender: KVSender | None = None
        self.emit: Callable[[list], None] | None = None

    # ---- intake ----
    def submit(self, msg: SubmitBlock) -> list:
        """Queue a block; refuses at once what could never fit this worker."""
        need = self.pool.pages_needed(msg.canvas.numel())
        if need > self.pool.num_pages:
            return [RequestFailed(msg.request_id, f"canvas of {msg.canvas.numel()} tokens needs {need} KV "
                                  f"pages; this worker has {self.pool.num_pages}")]
        if msg.request_id in self.tasks:
            return [RequestFailed(msg.request_id, "duplicate request id on worker")]
        task = self._task(msg)
        self.tasks[msg.request_id] = task
        self.waiting.push(task)
        return []

    def _task(self, msg: SubmitBlock) -> BlockTask:
        p = msg.params
        start = msg.prompt_len + msg.block_index * p.block_length
        schedule = None
        if p.steps is not None:
            n = steps_per_block(p.steps, num_blocks(p.max_tokens, p.block_length), msg.block_index)
            schedule = transfer_counts(p.block_length, n)
        return BlockTask(msg, msg.canvas.clone(), start, start + p.block_length,
                         torch.tensor(msg.stop_token_ids, dtype=torch.int64), schedule, step=msg.step_offset)

    # ---- KV handoff (disaggregated placement) ----
    def send_held(self, request_id: str, dst: int) -> bool:
        """HandoffKV: send a block held after its handoff prefill (its KVSent goes out at once, like
        a streamed group's); False if none is held."""
        t = self.tasks.get(request_id)
        if t is None or t.alloc is None or self.sender is None:
            return False
        del self.tasks[request_id]
        self.emit(self.sender.send_now([SendItem(request_id, t.msg.block_index, t.alloc, t.canvas.numel(), dst)]))
        return True

    def reserve_received(self, request_id: str, block_index: int, length: int) -> PageAlloc | None:
        """Pages for a block whose KV is about to arrive; None when they are short (refuse)."""
        if not self.pool.can_allocate(length):
            return None
        return self.pool.allocate(receiving_owner(request_id, block_index), length)

    def install_received(self, block: SubmitBlock) -> bool:
        """The KV is in place: the block waits for a decode seat like a local prefill."""
        if block.request_id in self.tasks:
            return False
        alloc = self.pool.rename(receiving_owner(block.request_id, block.block_index), block.request_id)
        if alloc is None:
            return False
        task = self._task(block)
        task.alloc = alloc
        self.tasks[block.request_id] = task
        self.ready.append(block.request_id)
        return True

    def abort(self, msg: Abort) -> None:
        task = self.tasks.pop(msg.request_id, None)
        if task is None:
            return
        self.pool.free(task.request_id)
        for lst in (self.ready, self.active):
            if task.request_id in lst:
                lst.remove(task.request_id)
        # waiting heap entries of removed tasks are skipped lazily

    @property
    def has_work(self) -> bool:
        """Something to compute: seated or seatable decodes, or a prefill waiting. Blocks held
        for a handoff or waiting for their KV to arrive are not work (the loop may sleep)."""
        return bool(self.active or self.ready or any(t.alloc is None for t in self.tasks.values()))

    @property
    def outstanding_prefill_tokens(self) -> int:
        return sum(t.canvas.numel() for t in self.tasks.values() if t.alloc is None)

    def load_report(self, worker_id: int, num_iterations: int, iteration_s: float) -> LoadReport:
        return LoadReport(worker_id, self.outstanding_prefill_tokens, len(self.active), self.pool.num_free_pages,
                          self.deficit_tokens, self.last.prefill_tokens + self.last.decode_tokens, num_iterations,
                          iteration_s, self.last.forward_s)

    # ---- one iteration ----
    def step(self) -> list:
        n_seat = seat_decodes(len(self.ready), num_active=len(self.active),
                              max_active_decodes=self.config.max_active_decodes)
        self.active.extend(self.ready[:n_seat])
        del self.ready[:n_seat]
        decodes = [self.tasks[r] for r in self.active]
        decode_items = [self._item(t, is_prefill=False) for t in decodes]
        decode_tokens = sum(it.fed_end - it.fed_start for it in decode_items)

        prefills = self._admit(decode_tokens)
        prefill_items = [self._item(t, is_prefill=True) for t in prefills]
        self.last.prefill_tokens = sum(t.canvas.numel() for t in prefills)
        self.last.decode_tokens = decode_tokens
        self.last.num_prefills, self.last.num_decodes = len(prefills), len(decodes)
        batch = prefills + decodes
        self.last.forward_s = 0.0
        if not batch:
            return []
        streamed = [SendItem(t.request_id, t.msg.block_index, t.alloc, t.canvas.numel(), t.msg.stream_to)
                    for t in prefills if t.msg.stream_to is not None and self.sender is not None]
        if streamed:
            self.emit(self.sender.open(streamed))
        try:
            self.num_forwards += 1
            n = self.config.fail_every_n_forwards
            if n and self.num_forwards % n == 0:
                raise RuntimeError("injected failure (fail_every_n_forwards)")
            timer = _ForwardTimer(self.runner.device)
            logits = self.runner.forward(prefill_items + decode_items,
                                         layer_done=self.sender.layer_done if streamed else None,
                                         decode_only=not prefills)
            timer.stop()
        except Exception as exc:   # a failed forward fails its requests, never the worker
            log.exception("forward failed")
            out = []
            for t in batch:
                self.abort(Abort(t.request_id))
                out.append(RequestFailed(t.request_id, f"forward failed: {exc}"))
            return out
        finally:
            if streamed:
                self.sender.close()     # a failed forward still completes the receiver's receives
        out = self._commit(batch, logits, n_prefills=len(prefills))
        self.last.forward_s = timer.seconds()   # after the commit's device-to-host copy: no extra sync
        return out

    def _admit(self, decode_tokens: int) -> list[BlockTask]:
        heap = self.waiting.heap
        while heap and heap[0][2] not in self.tasks:
            heapq.heappop(heap)
        ordered = [e for e in sorted(heap) if e[2] in self.tasks]
        candidates = [PrefillCandidate(rid, seq, self.tasks[rid].canvas.numel(),
                                       self.pool.pages_needed(self.tasks[rid].canvas.numel()))
                      for seq, _, rid in ordered]
        decision = admit(candidates, decode_tokens=decode_tokens, token_budget=self.config.token_budget,
                         deficit_tokens=self.deficit_tokens, free_pages=self.pool.num_free_pages,
                         num_active=len(self.active), num_ready=len(self.ready),
                         max_active_decodes=self.config.max_active_decodes)
        self.deficit_tokens = decision.deficit_tokens
        self.last.deficit_tokens = decision.deficit_tokens
        admitted = set(decision.admitted)
        self.waiting.heap = [e for e in ordered if e[2] not in admitted]
        heapq.heapify(self.waiting.heap)
        tasks = [self.tasks[rid] for rid in decision.admitted]
        for t in tasks:
            t.alloc = self.pool.allocate(t.request_id, t.canvas.numel())
        return tasks

    def _item(self, t: BlockTask, is_prefill: bool) -> ForwardItem:
        a, b = fed_range(self.config.cache, is_prefill, t.start, t.end, t.canvas.numel(),
                         self.args.logit_shift)
        return ForwardItem(t.canvas, t.alloc, a, b, t.start, t.end)

    def _commit(self, batch: list[BlockTask], logits: torch.Tensor, n_prefills: int) -> list:
        """Sampling runs where the logits are (no [B, K, V] copy to the host); only the commit
        mask and the proposals come back, in one transfer."""
        mask_id = self.args.mask_id
        dev = logits.device
        width = logits.shape[1]
        masked = torch.zeros(len(batch), width, dtype=torch.bool)
        for i, t in enumerate(batch):
            masked[i, : t.end - t.start] = t.canvas[t.start:t.end] == mask_id
        masked = masked.to(dev)
        widths = [t.end - t.start for t in batch]
        needs_rng = [t.msg.params.temperature > 0 or t.msg.params.remasking == "random" for t in batch]
        gens = [unmask.step_generator(t.msg.params.seed, t.msg.block_index, t.step, dev) if r else None
                for t, r in zip(batch, needs_rng)]
        tokens, conf = unmask.propose(logits, [t.msg.params.temperature for t in batch], gens, widths, mask_id,
                                      [t.msg.params.top_p for t in batch])
        score = unmask.random_scores(widths, gens, width, [t.msg.params.remasking == "random" for t in batch], conf)
        nan = float("nan")
        threshold = torch.tensor([t.msg.params.threshold for t in batch], dtype=torch.float64, device=dev)
        factor = torch.tensor([nan if t.msg.params.factor is None else t.msg.params.factor for t in batch],
                              dtype=torch.float64, device=dev)
        fixed = torch.tensor([-1 if t.schedule is None else t.schedule[min(t.step, len(t.schedule) - 1)]
                              for t in batch], dtype=torch.int64, device=dev)
        count = unmask.commit_counts(score, masked, threshold, factor, fixed)
        commit = unmask.select_commits(score, masked, count)
        host = torch.stack((commit.to(torch.int64), tokens)).cpu()   # the step's one device-to-host sync
        commit, tokens = host[0].bool(), host[1]

        out: list = []
        for i, t in enumerate(batch):
            cols = commit[i].nonzero().squeeze(-1)
            positions = cols + t.start
            t.canvas[positions] = tokens[i, cols]
            p = t.msg.params
            answer = t.canvas[t.msg.prompt_len:]
            out.append(StepDelta(t.request_id, t.msg.block_index, t.step, tuple(positions.tolist()),
                                 tuple(tokens[i, cols].tolist()), int((answer == mask_id).sum())))
            t.step += 1
            final = is_final(answer, mask_id, t.stop_ids, p.max_tokens, p.ignore_eos)
            if final or not bool((t.canvas[t.start:t.end] == mask_id).any()):
                out.append(BlockDone(t.request_id, t.msg.block_index, t.step, final))
                self._retire(t, was_prefill=i < n_prefills)
            elif i < n_prefills and t.msg.handoff:
                out.append(PrefillDone(t.request_id, t.msg.block_index, t.step))
                if t.msg.stream_to is not None and self.sender is not None:
                    del self.tasks[t.request_id]       # its KV is on the way; pages go with the send
            elif i < n_prefills:
                self.ready.append(t.request_id)
        return out

    def _retire(self, t: BlockTask, was_prefill: bool) -> None:
        self.tasks.pop(t.request_id, None)
        self.pool.free(t.request_id)
        if not was_prefill:
            self.active.remove(t.request_id)
