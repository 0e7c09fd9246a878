"""WorkerCore: one worker's state and iteration, single-threaded and free of queues and sleeps.
`step()` runs every admitted prefill and seated decode in one packed forward. A block the router left a
continuation for (`then`) queues its next block's re-prefill here, on the same canvas and pages."""
from __future__ import annotations

import bisect
import logging
import time
from itertools import compress
from typing import Callable

import torch

from ..config import WorkerConfig
from ..decoding.stop import AnswerMarks
from ..messages import (Abort, BlockDone, ContinueBlock, Evict, Evicted, HandoffKV, InstallKV, LoadReport, PrefillDone,
                        ReceiveKV, RequestFailed, ReviseBlock, SetPolicy, StepDelta, SubmitBlock)
from .admission import PrefillCandidate, admit, seat_decodes
from .handoff import Install, WorkerHandoffs
from .kv_pool import KVPool
from .model_step import Stepper
from .runner import InstanceBroken
from .prefix_cache import PrefixCache
from .task import ACTIVE, HELD, PREFILL, READY, WAITING, BlockTask, IterationStats, iteration_load

__all__ = ["WorkerCore", "BlockTask", "IterationStats", "iteration_load"]

log = logging.getLogger(__name__)

class WorkerCore:
    def __init__(self, config: WorkerConfig, stepper: Stepper, pool: KVPool, mask_id: int,
                 handoffs: WorkerHandoffs | None = None, emit: Callable[[list], None] | None = None,
                 prefix_cache: PrefixCache | None = None):
        self.config = config
        self.prefix_cache = prefix_cache
        self.stepper = stepper
        self.pool = pool
        self.mask_id = mask_id
        self.handoffs = handoffs
        self.emit = emit                    # sends at once: a KVSent must leave before its data
        self.policy = config.policy
        self.tasks: dict[str, BlockTask] = {}
        self.waiting: list[tuple[float, int, int, str]] = []   # keys of WAITING tasks, kept sorted (arrival order)
        self.ready: list[str] = []
        self.active: list[str] = []
        self.deficit_tokens = 0
        self.last = IterationStats()
        self.num_forwards = 0
        self._handlers = {SubmitBlock: self.submit, ContinueBlock: self.continue_block, Abort: self.abort,
                          HandoffKV: self.send_held, ReceiveKV: self.receive_kv, InstallKV: self.install_kv,
                          SetPolicy: self.set_policy, ReviseBlock: self.revise_block, Evict: self.evict}

    def handle(self, msg) -> list:
        """Apply one message from the request side; returns the messages it produces."""
        return self._handlers[type(msg)](msg)

    def submit(self, msg: SubmitBlock) -> list:
        """Queue a block, refusing what could never fit; the core owns (and updates) its canvas from here on."""
        need = self.pool.pages_needed(msg.canvas.numel())
        if need > self.pool.num_pages:
            return [RequestFailed(msg.request_id, f"canvas of {msg.canvas.numel()} tokens needs {need} KV "
                                  f"pages; this worker has {self.pool.num_pages}")]
        if msg.request_id in self.tasks:
            return [RequestFailed(msg.request_id, "duplicate request id on worker")]
        task = self._task(msg)
        self.tasks[msg.request_id] = task
        bisect.insort(self.waiting, task.key)
        return []

    def _task(self, msg: SubmitBlock) -> BlockTask:
        start, end = msg.params.block_bounds(msg.prompt_len, msg.block_index)
        marks = AnswerMarks(msg.canvas, msg.prompt_len, self.mask_id, msg.stop_token_ids, msg.params.ignore_eos)
        task = BlockTask(msg.request_id, msg.block_index, msg.prompt_len, msg.params, msg.policy, marks,
                         msg.arrival_seq, msg.canvas, start, end, msg.handoff, msg.stream_to, msg.then,
                         step=msg.step_offset)
        if self.prefix_cache is not None and msg.params.block_causal and not msg.handoff:
            task.prefix_keys = self.prefix_cache.keys(msg.canvas, msg.params.block_bounds(msg.prompt_len, 0)[0])
        return task

    def continue_block(self, msg: ContinueBlock) -> list:
        t = self.tasks.get(msg.request_id)
        if t is not None and t.block_index == msg.block_index and not t.handoff:
            t.then = msg.then
        return []

    def revise_block(self, msg: ReviseBlock) -> list:
        t = self.tasks.get(msg.request_id)
        if t is not None and t.block_index == msg.block_index:
            if t.phase == WAITING and msg.policy.priority != t.policy.priority:   # its place in line moves
                self.waiting.remove(t.key)
                t.policy = msg.policy
                bisect.insort(self.waiting, t.key)
            else:
                t.policy = msg.policy
        return []

    def evict(self, msg: Evict) -> list:
        t = self.tasks.get(msg.request_id)
        if t is None or t.block_index != msg.block_index or t.phase != WAITING or t.handoff:
            return [Evicted(msg.request_id, msg.block_index, False)]
        self.waiting.remove(t.key)
        del self.tasks[t.request_id]
        self._free(t, written=False)
        return [Evicted(msg.request_id, msg.block_index, True)]

    def set_policy(self, msg: SetPolicy) -> list:
        self.policy = msg.policy
        return []

    def abort(self, msg: Abort) -> list:
        if self.handoffs is not None:
            self.handoffs.abort(msg.request_id)
        task = self.tasks.pop(msg.request_id, None)
        if task is None:
            return []
        self._free(task, written=task.phase in (READY, ACTIVE))   # a failed prefill's KV is not kept
        if task.phase == WAITING:
            self.waiting.remove(task.key)
        elif task.phase == READY:
            self.ready.remove(task.request_id)
        elif task.phase == ACTIVE:
            self.active.remove(task.request_id)
        return []

    def send_held(self, msg: HandoffKV) -> list:
        t = self.tasks.get(msg.request_id)
        if t is None or t.phase != HELD or self.handoffs is None:
            return [RequestFailed(msg.request_id, "handoff of a block this worker does not hold")]
        del self.tasks[msg.request_id]
        self.emit(self.handoffs.send_held(t.request_id, t.block_index, t.alloc, t.canvas.numel(), msg.dst_worker))
        return []

    def receive_kv(self, msg: ReceiveKV) -> list:
        self.handoffs.post(msg)
        return []

    def install_kv(self, msg: InstallKV) -> list:
        for inst in self.handoffs.install(msg.block):
            self._install(inst)
        return []

    def poll_transfers(self) -> list:
        """Finished KV transfers: HandoffDone messages; received blocks join the ready queue."""
        if self.handoffs is None:
            return []
        out, installs = self.handoffs.poll()
        for inst in installs:
            self._install(inst)
        return out

    def _install(self, inst: Install) -> None:
        rid = inst.block.request_id
        if rid in self.tasks:
            self.pool.free(inst.owner)
            return
        alloc = self.pool.rename(inst.owner, rid)
        if alloc is None:
            return
        task = self._task(inst.block)
        task.alloc, task.phase = alloc, READY
        self.tasks[rid] = task
        self.ready.append(rid)

    @property
    def has_work(self) -> bool:
        """Something to compute; blocks held for a handoff or awaiting their KV are not work (the loop may sleep)."""
        return bool(self.active or self.ready or self.waiting)

    @property
    def transfers_pending(self) -> bool:
        return self.handoffs is not None and self.handoffs.pending

    @property
    def outstanding_prefill_tokens(self) -> int:
        return sum(self.tasks[rid].canvas.numel() for *_, rid in self.waiting)

    def load_report(self, worker_id: int, num_iterations: int, iteration_s: float,
                    messages_handled: int = 0) -> LoadReport:
        last, cache = self.last, self.prefix_cache
        prefix = (cache.hit_tokens, cache.query_tokens, cache.num_cached_pages, cache.evicted_pages) if cache \
            else None
        return LoadReport(worker_id, self.outstanding_prefill_tokens, len(self.active), self.pool.num_available_pages,
                          self.deficit_tokens, last.prefill_tokens + last.decode_tokens, num_iterations,
                          iteration_s, last.forward_s, last.prefill_tokens, last.num_prefills, self.policy,
                          last.decode_keys, last.prefill_sq, self.has_work, messages_handled, prefix)

    def step(self) -> list:
        n_seat = seat_decodes(len(self.ready), num_active=len(self.active),
                              max_active_decodes=self.policy.max_active_decodes)
        if n_seat:
            seated = self.ready[:n_seat]
            for rid in seated:
                self.tasks[rid].phase = ACTIVE
            self.active.extend(seated)
            del self.ready[:n_seat]
        tasks, fed = self.tasks, self.stepper.fed_tokens
        decodes = [tasks[r] for r in self.active]
        decode_tokens = sum([fed(t, False) for t in decodes])
        prefills = self._admit(decode_tokens)
        last = self.last = iteration_load(prefills, decodes, decode_tokens)
        last.deficit_tokens = self.deficit_tokens
        batch = prefills + decodes
        if not batch:
            return []
        streamed = [(t.request_id, t.block_index, t.alloc, t.canvas.numel(), t.stream_to)
                    for t in prefills if t.stream_to is not None and self.handoffs is not None]
        if streamed:
            self.emit(self.handoffs.open_streams(streamed))
        try:
            self.num_forwards += 1
            n = self.config.hooks.fail_every_n_forwards
            if n and self.num_forwards % n == 0:
                raise RuntimeError("injected failure (fail_every_n_forwards)")
            if self.num_forwards == self.config.hooks.hang_at_forward:
                _hang_forever()
            result = self.stepper.run(prefills, decodes, self.handoffs.layer_done if streamed else None)
        except InstanceBroken:     # the process ends; its followers may sit in an all-reduce a CLOSE would meet
            streamed = []
            raise
        except Exception as exc:   # a failed forward fails its requests, never the worker
            log.exception("forward failed")
            out = []
            for t in batch:
                self.abort(Abort(t.request_id))
                out.append(RequestFailed(t.request_id, f"forward failed: {exc}"))
            return out
        finally:
            if streamed:
                self.handoffs.close_streams()     # a failed forward still completes the receiver's receives
        last.forward_s = result.forward_s
        return self._apply(batch, result.commit, result.tokens, len(prefills), result.summary, result.logprobs,
                           result.constraint_ms)

    def _admit(self, decode_tokens: int) -> list[BlockTask]:
        waiting = [self.tasks[rid] for *_, rid in self.waiting]
        cache = self.prefix_cache
        if cache is not None:
            for t in waiting:
                if t.prefix_keys and t.alloc is None:
                    t.cached_len = cache.peek(t.prefix_keys) * cache.unit_tokens
        fed = self.stepper.fed_tokens
        candidates = [PrefillCandidate(t.request_id, t.arrival_seq,
                                       fed(t, True) if t.params.block_causal else t.canvas.numel(),
                                       0 if t.alloc is not None else self.pool.pages_needed(t.canvas.numel()))
                      for t in waiting]
        pol = self.policy
        decision = admit(candidates, decode_tokens=decode_tokens, token_budget=pol.token_budget,
                         deficit_tokens=self.deficit_tokens, free_pages=self.pool.num_available_pages,
                         num_active=len(self.active), num_ready=len(self.ready),
                         max_active_decodes=pol.max_active_decodes, credit_share=pol.credit_share)
        self.deficit_tokens = decision.deficit_tokens
        if not decision.admitted:
            return []
        chosen = set(decision.admitted)
        admitted = [t for t in waiting if t.request_id in chosen]
        if waiting[len(admitted) - 1] is admitted[-1]:
            del self.waiting[: len(admitted)]          # a prefix, unless page holders passed a stalled head
        else:
            self.waiting = [k for k in self.waiting if k[-1] not in chosen]
        # Cache hits first: once referenced they cannot be reclaimed by the allocations that follow.
        shared = {t.request_id: self._lookup(t) for t in admitted if t.alloc is None and t.prefix_keys}
        for t in admitted:
            t.phase = PREFILL
            if t.alloc is None:
                t.alloc = self.pool.allocate(t.request_id, t.canvas.numel(), shared.get(t.request_id, ()))
        return admitted

    def _lookup(self, t: BlockTask) -> list[int]:
        pages = self.prefix_cache.lookup(t.prefix_keys)
        t.prefix_hits = len(pages) // self.prefix_cache.unit_pages
        t.cached_len = t.prefix_hits * self.prefix_cache.unit_tokens
        return pages

    def _apply(self, batch: list[BlockTask], commit: torch.Tensor, tokens: torch.Tensor, n_prefills: int,
               summary: torch.Tensor | None = None, logprobs: dict | None = None,
               constraint_ms: dict | None = None) -> list:
        out: list = []
        # the simulator's stepper hands rows as lists already
        commits = commit if isinstance(commit, list) else commit.tolist()
        values = tokens if isinstance(tokens, list) else tokens.tolist()
        features = summary.tolist() if summary is not None else None
        columns = range(len(commits[0])) if commits else range(0)
        for i, t in enumerate(batch):
            row = commits[i]
            cols = list(compress(columns, row))
            committed = list(compress(values[i], row))
            marks = t.marks
            had_masks = t.params.editing and marks.any_masked(t.start, t.end)
            positions = marks.commit(t.start, cols, committed)
            lps = () if not logprobs or i not in logprobs else _token_logprobs(logprobs[i], cols)
            out.append(StepDelta(t.request_id, t.block_index, t.step, positions, tuple(committed), marks.num_masked,
                                 () if features is None else tuple(features[i]), lps,
                                 constraint_ms[i] if constraint_ms and i in constraint_ms else 0.0))
            t.step += 1
            if t.params.editing:      # the block may still change its tokens: nothing is final before its end
                block_over = _editing_block_over(t, had_masks, bool(cols))
                final = block_over and marks.is_final(t.params.max_tokens)
            else:
                final = marks.is_final(t.params.max_tokens)
                block_over = final or not marks.any_masked(t.start, t.end)
            was_prefill = i < n_prefills
            if block_over:
                out.append(self._end_block(t, final))
            elif was_prefill and t.handoff:
                out.append(PrefillDone(t.request_id, t.block_index, t.step))
                if t.stream_to is not None and self.handoffs is not None:
                    del self.tasks[t.request_id]       # its pages went to the send
                else:
                    t.phase = HELD
            elif was_prefill:
                t.phase = READY
                self.ready.append(t.request_id)
        return out

    def _next_causal_block(self, t: BlockTask, done: BlockDone) -> BlockDone:
        """A block-causal request goes on to its next block here, seated: its KV is exact, so no re-prefill."""
        seated = t.phase == ACTIVE
        t.next_block()
        if seated:
            t.phase = ACTIVE
        else:
            t.phase = READY
            self.ready.append(t.request_id)
        return BlockDone(done.request_id, done.block_index, done.num_steps, False, True, done.policy)

    def _end_block(self, t: BlockTask, final: bool) -> BlockDone:
        more = t.block_index + 1 < t.params.num_blocks(t.prompt_len)
        done = BlockDone(t.request_id, t.block_index, t.step, final, policy=t.policy)
        if t.params.block_causal and not final and more and not t.handoff:
            return self._next_causal_block(t, done)
        if t.phase == ACTIVE:
            self.active.remove(t.request_id)
        if not final and more and t.then is not None and not t.handoff:
            t.next_block()
            bisect.insort(self.waiting, t.key)
            return BlockDone(done.request_id, done.block_index, done.num_steps, False, True, done.policy)
        del self.tasks[t.request_id]
        self._free(t, written=True)
        return done

    def _free(self, t: BlockTask, written: bool) -> None:
        """Its pages back to the pool; under the prefix cache its written prompt units join the cache first."""
        if t.prefix_keys is not None and self.prefix_cache is not None:
            self.prefix_cache.release(t.prefix_keys, t.prefix_hits,
                                      t.alloc.pages if written and t.alloc is not None else None)
            t.prefix_keys = None
        self.pool.free(t.request_id)


def _editing_block_over(t: BlockTask, had_masks: bool, wrote: bool) -> bool:
    """Token editing's end of a block, as LLaDA2.1's own generate: a forward that found no mask and changed
    nothing settles it; at most max_post_edit_steps forwards run with no mask left (the budget is checked before
    a forward, so none is wasted)."""
    if not had_masks:
        t.post_steps += 1
        if not wrote:              # with no mask left, every write is an edit
            return True
    if t.marks.any_masked(t.start, t.end):
        return False
    return t.post_steps >= t.params.max_post_edit_steps


def _token_logprobs(row: tuple, cols: list[int]) -> tuple:
    chosen, ids, vals = (x.tolist() for x in row)
    return tuple((chosen[c], tuple(zip(ids[c], vals[c]))) for c in cols)


def _hang_forever() -> None:
    """TEST ONLY (hang_at_forward): a forward that never returns, as a wedged device would."""
    log.warning("hang_at_forward: this worker now hangs")
    while True:
        time.sleep(3600)
