"""The front-side scheduler parts, without processes: real message objects in, what they send
collected in a list, a fake clock."""
import asyncio
import dataclasses

import pytest

from dllm_server.config import ServerConfig
from dllm_server.decoding.params import BlockPolicy, SamplingParams
from dllm_server.request.detok import IncrementalDetokenizer
from dllm_server.scheduler.handoffs import FallBack, Handoffs, InstallBlock, Moved, Send
from dllm_server.policy.base import FixedPolicy
from dllm_server.request.state import RequestState
from dllm_server.request.events import STREAM_NONE, STREAM_TEXT
from dllm_server.scheduler.request_table import Entry, RequestTable
from dllm_server.scheduler.scheduler import Scheduler
from dllm_server.engine.stats import snapshot
from dllm_server.scheduler.worker_table import WorkerTable
from dllm_server.messages import (Abort, BlockDone, ContinueBlock, HandoffDone, HandoffKV, InstallKV, KVSent,
                                  LoadReport, ModelInfo, PrefillDone, ReceiveKV, ReviseBlock, SetPolicy, StepDelta,
                                  SubmitBlock,
                                  WorkerReady)

MASK, EOS = 261, 256
INFO = ModelInfo("llada", 262, 320, MASK, EOS, 1024, 64, 2, 4, 4, 16, 128)
P = BlockPolicy(0.9)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def make(roles, pages=64, **cfg):
    """A scheduler over fake workers; arrival order (the lease and routing mechanics, not the ordering's)."""
    sent, clock = [], Clock()
    config = ServerConfig(block_length=8, **{"scheduling_policy": "fcfs", **cfg})
    s = Scheduler(config, roles, None, lambda w, m: sent.append((w, m)), FixedPolicy(0.9), clock)
    for w in range(len(roles)):
        s.on_messages(w, [WorkerReady(w, pages if roles[w] != "decode" else pages, 16, INFO)])
    return s, sent, clock


def request(rid, max_tokens=24, prompt=(1, 2, 3), stream=STREAM_NONE, seq=0, slo_ms=None):
    params = SamplingParams(max_tokens=max_tokens, slo_ms=slo_ms)
    st = RequestState(rid, None, list(prompt), params, params.resolve(8, 1), MASK,
                      (EOS,), seq)
    return Entry(st, asyncio.Queue(), stream, 0.0)


def delta(rid, block, step, positions, tokens, masked):
    return StepDelta(rid, block, step, tuple(positions), tuple(tokens), masked)


def of(sent, kind):
    return [(w, m) for w, m in sent if isinstance(m, kind)]


# ---- request table, worker table ----
def test_request_table_counts_waiting_until_started_and_evicts():
    t = RequestTable()
    a, b = request("a"), request("b")
    t.add(a), t.add(b)
    assert len(t) == 2 and t.num_waiting == 2
    t.started(a), t.started(a)
    assert t.num_waiting == 1
    t.remove(b)
    assert len(t) == 1 and t.num_waiting == 0 and b.done and t.get("b") is None


def test_worker_table_loads_reports_and_losses():
    w = WorkerTable(["prefill", "decode"], 16, ServerConfig().worker_policy())
    assert not w.all_ready and w.has_prefill_role
    w.on_ready(WorkerReady(0, 40, 16, INFO))
    w.on_ready(WorkerReady(1, 30, 16, INFO))
    assert w.all_ready and w.model == INFO and w.min_capacity_pages() == 40 and w.pages_for(33) == 3
    assert w.on_report(1, LoadReport(1, 0, 0, 25, 0, 0, 3)) and not w.on_report(1, LoadReport(1, 0, 0, 24, 0, 0, 3))
    w[1].reserved_pages = 4
    assert [x.free_pages for x in w.loads()] == [40, 20]
    w.lost({1})
    assert not w.is_healthy and w.loads()[1].available is False and w[1].reserved_pages == 0


# ---- scheduler: colocated routing and continuation leases ----
def test_single_worker_leases_every_next_block_and_finishes():
    s, sent, _ = make(["colocated"])
    e = request("r", max_tokens=24)                   # 3 blocks of 8
    s.add(e)
    [(w, sub)] = of(sent, SubmitBlock)
    assert w == 0 and sub.block_index == 0 and sub.policy == P and sub.then == P   # keep it here
    assert s.workers[0].outstanding_prefill_tokens == 3 + 24
    s.on_messages(0, [delta("r", 0, 0, range(3, 11), [65] * 8, 16), BlockDone("r", 0, 1, False, True, P)])
    assert s.workers[0].outstanding_prefill_tokens == 27      # the continued block is outstanding there
    [(w, cont)] = of(sent, ContinueBlock)
    assert (w, cont.block_index, cont.then) == (0, 1, P)
    s.on_messages(0, [delta("r", 1, 0, range(11, 19), [66] * 8, 8), BlockDone("r", 1, 1, False, True, P)])
    assert len(of(sent, ContinueBlock)) == 1                  # the last block has nothing to lease
    s.on_messages(0, [delta("r", 2, 0, range(19, 27), [67] * 8, 0), BlockDone("r", 2, 1, True, False, P)])
    out = e.events.get_nowait().output
    assert out.token_ids == [65] * 8 + [66] * 8 + [67] * 8 and out.finish_reason == "length"
    assert out.stats.steps_per_block == [1, 1, 1] and out.stats.block_policies == [P, P, P]
    st = snapshot(s, {})
    assert st.num_requests == 0 and st.counters.blocks_continued == 2 and st.workers[0].outstanding_prefill_tokens == 0
    assert len(of(sent, SubmitBlock)) == 1                    # no canvas crossed again


def test_two_workers_route_by_outstanding_tokens_and_withhold_the_lease():
    s, sent, _ = make(["colocated", "colocated"])
    r1, r2, r3 = request("r1", seq=0), request("r2", seq=1), request("r3", seq=2)
    s.add(r1)
    s.add(r2)
    assert [w for w, _ in of(sent, SubmitBlock)] == [0, 1]
    s.on_messages(1, [delta("r2", 0, 0, [3], [65], 23)])      # r2 started: worker 1 has nothing outstanding
    s.add(r3)                                                 # worker 0 still has r1's prefill outstanding
    assert of(sent, SubmitBlock)[-1][0] == 1
    s.on_messages(0, [delta("r1", 0, 0, [3], [65], 23)])
    sent.clear()
    # r1's block 0 continues on worker 0; worker 1 holds r3's outstanding prefill: keep r1 on 0
    s.on_messages(0, [BlockDone("r1", 0, 2, False, True, P)])
    assert [(w, m.block_index) for w, m in of(sent, ContinueBlock)] == [(0, 1)]
    s.on_messages(1, [delta("r3", 0, 0, [3], [65], 23)])
    s.on_messages(0, [delta("r1", 1, 0, [11], [65], 22)])
    s.add(request("r4", seq=3))                               # routed to worker 0 (ties: lowest id)
    sent.clear()
    s.on_messages(0, [delta("r1", 1, 1, range(12, 19), [66] * 7, 15), BlockDone("r1", 1, 2, False, False, P)])
    [(w, sub)] = of(sent, SubmitBlock)
    assert w == 1 and sub.block_index == 2 and sub.canvas[11:19].tolist() == [65] + [66] * 7


def test_abort_and_worker_loss_end_requests_without_hanging():
    s, sent, _ = make(["colocated", "colocated"])
    a, b = request("a"), request("b")
    s.add(a), s.add(b)
    s.abort("a")
    assert (0, Abort("a")) in sent and a.events.get_nowait().output.finish_reason == "abort"
    s.on_worker_lost([1], "worker 1 died", resume=False)        # nothing will serve it again: it fails
    out = b.events.get_nowait().output
    assert out.finish_reason == "error" and out.error == "worker 1 died" and snapshot(s, {}).num_requests == 0


def test_a_lost_workers_requests_resume_from_their_blocks_start_elsewhere():
    s, sent, _ = make(["colocated", "colocated"])
    r = request("r", max_tokens=24, prompt=(1, 2, 3))
    s.add(r)
    [(w, first)] = of(sent, SubmitBlock)
    s.on_messages(w, [delta("r", 0, 0, [3, 4], [70, 71], 22)])        # block 0 half done on worker w
    sent.clear()
    s.on_worker_lost([w], f"worker {w} died")
    [(w2, again)] = of(sent, SubmitBlock)
    assert w2 != w and again.block_index == 0 and again.canvas.tolist() == first.canvas.tolist()   # masked again
    assert r.state.answer[:2] == [70, 71] and s.counters.requests_resumed == 1 and r.events.empty()
    r.resumes = 3                                       # its workers keep dying under it (it may be what kills them)
    s.on_worker_lost([w2], f"worker {w2} died")
    out = r.events.get_nowait().output
    assert out.finish_reason == "error" and out.error == f"worker {w2} died (its worker died 4 times under it)"


def test_set_policy_reaches_the_workers_and_the_router():
    s, sent, _ = make(["prefill", "decode"], placement="hybrid")
    s.set_policy(token_budget=256, max_active_decodes=4, overflow_threshold_tokens=99)
    pols = [(w, m.policy) for w, m in of(sent, SetPolicy)]
    assert [w for w, _ in pols] == [0, 1] and all(p.token_budget == 256 and p.max_active_decodes == 4 for _, p in pols)
    assert s.theta == 99 and snapshot(s, {}).workers[1].policy.token_budget == 256
    sent.clear()
    with pytest.raises(ValueError, match="max_active_decodes"):
        s.set_policy(worker_id=1, max_active_decodes=0)
    assert sent == [] and snapshot(s, {}).workers[1].policy.max_active_decodes == 4
    s.set_policy(worker_id=1, token_budget=None)
    assert [(w, m.policy.token_budget) for w, m in of(sent, SetPolicy)] == [(1, None)]


# ---- disaggregated handoffs through the scheduler ----
def test_layerwise_handoff_moves_the_block_and_times_the_stall():
    s, sent, clock = make(["prefill", "decode"], placement="disaggregated")
    e = request("r", max_tokens=16)
    s.add(e)
    [(w, sub)] = of(sent, SubmitBlock)
    assert w == 0 and sub.handoff and sub.stream_to == 1 and sub.then is None
    assert s.workers[1].reserved_pages == 2
    s.on_messages(0, [KVSent(0, 1, ("r",), (0,), (19,), 0)])
    [(w, recv)] = of(sent, ReceiveKV)
    assert w == 1 and recv.keep == (True,)
    s.on_messages(0, [delta("r", 0, 0, [3, 4], [65, 66], 14), PrefillDone("r", 0, 1)])
    [(w, inst)] = of(sent, InstallKV)
    assert w == 1 and inst.block.step_offset == 1 and inst.block.canvas[3:5].tolist() == [65, 66]
    s.on_messages(1, [HandoffDone("r", 0, 1, False, True, 100, 0.01)])
    assert s.workers[1].reserved_pages == 0
    clock.t += 0.25
    s.on_messages(1, [delta("r", 0, 1, [5], [67], 13)])       # the first decode step on the decode worker
    c = snapshot(s, {}).counters
    assert c.kv_handoffs == 1 and c.kv_handoff_stall_seconds == pytest.approx(0.25)
    s.on_messages(0, [HandoffDone("r", 0, 0, True, True, 100, 0.01)])
    assert snapshot(s, {}).counters.kv_transfer_bytes == 100


def test_refused_handoff_falls_back_to_a_local_re_prefill():
    s, sent, _ = make(["prefill", "decode"], placement="disaggregated")
    s.add(request("r", max_tokens=16))
    s.on_messages(0, [KVSent(0, 1, ("r",), (0,), (19,), 0)])
    s.on_messages(1, [HandoffDone("r", 0, 1, False, False)])           # pages short: drained
    sent.clear()
    s.on_messages(0, [delta("r", 0, 0, [3], [65], 15), PrefillDone("r", 0, 1)])
    [(w, sub)] = of(sent, SubmitBlock)
    assert not sub.handoff and sub.stream_to is None and sub.step_offset == 1
    assert snapshot(s, {}).counters.kv_transfers_failed == 1 and s.workers[1].reserved_pages == 0


def test_held_block_is_sent_once_a_decode_worker_has_room():
    s, sent, _ = make(["prefill", "decode"], placement="disaggregated", kv_transfer="after_prefill")
    s.on_messages(1, [LoadReport(1, 0, 0, 1, 0, 0, 1)])               # the decode worker: 1 free page
    s.add(request("r", max_tokens=16))                                 # needs 2 pages
    s.on_messages(0, [delta("r", 0, 0, [3], [65], 15), PrefillDone("r", 0, 1)])
    assert snapshot(s, {}).num_held == 1 and not of(sent, HandoffKV)
    s.on_messages(1, [LoadReport(1, 0, 0, 10, 0, 0, 2)])
    assert of(sent, HandoffKV) == [(0, HandoffKV("r", 1))] and snapshot(s, {}).num_held == 0


def test_handoff_part_alone_install_then_receiver_verdict_in_either_order():
    workers = WorkerTable(["prefill", "decode"], 16, ServerConfig().worker_policy())
    for i in (0, 1):
        workers.on_ready(WorkerReady(i, 64, 16, INFO))
    h = Handoffs(workers, layerwise=True, clock=lambda: 0.0)
    assert h.begin("a", 0, 0, 2, P) == 1 and h.begin("b", 0, 0, 2, P) == 1
    acts = h.on_kv_sent(KVSent(0, 1, ("a", "b"), (0, 0), (20, 20), 8))
    assert acts == [Send(1, ReceiveKV(0, ("a", "b"), (0, 0), (20, 20), (True, True), 8))]
    # a: the receiver's verdict first, then the prefill step
    assert h.on_handoff_done(HandoffDone("a", 0, 1, False, True)) == []
    assert h.on_prefill_done("a", PrefillDone("a", 0, 2)) == [InstallBlock("a", 1, 2, P), Moved("a", 1)]
    # b: the prefill step first, then a refusal
    assert h.on_prefill_done("b", PrefillDone("b", 0, 1)) == [InstallBlock("b", 1, 1, P)]
    assert h.on_handoff_done(HandoffDone("b", 0, 1, False, False)) == [FallBack("b", 1, P)]
    assert workers[1].reserved_pages == 0 and not h.active
    # a request that ends while its KV is relayed: the receiver frees the pages when the data is in
    h.begin("c", 0, 0, 2, P)
    h.on_kv_sent(KVSent(0, 1, ("c",), (0,), (20,), 16))
    assert h.release("c") == [Send(1, Abort("c"))] and workers[1].reserved_pages == 0


def test_text_stream_events_only_when_visible_text_grows():
    s, sent, _ = make(["colocated"])
    e = request("t", max_tokens=8, stream=STREAM_TEXT)
    e.state.detok = IncrementalDetokenizer(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    s.add(e)
    s.on_messages(0, [delta("t", 0, 0, [5], [66], 7)])                 # not contiguous yet: no text
    assert e.events.empty()
    s.on_messages(0, [delta("t", 0, 1, [3, 4], [72, 105], 5)])         # "Hi" then "B"
    assert e.events.get_nowait().text == "HiB" and e.events.empty()


def test_routing_by_predicted_completion_prefers_the_sooner_worker():
    from dllm_server.scheduler.placement import WorkerLoad, keeps_request, pick_by_completion
    loads = [WorkerLoad(0, "colocated", 0, 64, 64, True), WorkerLoad(1, "colocated", 500, 64, 64, True),
             WorkerLoad(2, "colocated", 0, 2, 2, True)]
    assert pick_by_completion(loads, {0: 0.5, 1: 0.2, 2: 0.1}, pages_needed=4) == 1   # 2 cannot hold the canvas
    assert keeps_request(loads, "colocated", 0, 4, {0: 0.2, 1: 0.2}) is True         # ties stay put
    shared = [dataclasses.replace(loads[0], holding=1), *loads[1:]]      # another request runs on worker 0
    assert keeps_request(shared, "colocated", 0, 4, {0: 0.3, 1: 0.2}) is False
    # through the scheduler: worker 1, a TP2 instance, is twice as fast as worker 0, so both go there while idle
    s, sent, _ = make(["colocated", "colocated"], routing="completion")
    fast = [(d, d * 6, 0.0, 0.0, 0.001 + 1e-5 * d) for d in (8, 16, 32, 64)]
    s.load.seed(0, [(d, k, p, q, 2 * t) for d, k, p, q, t in fast])
    s.load.forget(1)
    s.load.seed(1, fast, tp_size=2)
    s.add(request("a"))
    s.add(request("b", seq=1))
    assert [w for w, _ in of(sent, SubmitBlock)] == [1, 1]


def test_instances_of_one_tp_degree_share_one_step_time_model():
    """Identical instances fitted apart disagreed by up to 2x, and routing by completion followed the disagreement:
    every TP1 worker reads one model (seeded by the first, refined by all their reports), a TP2 its own; a slot
    that a regroup emptied and refilled joins its new degree's model."""
    from dllm_server.costmodel.step_time import features
    from dllm_server.costmodel.worker_speed import WorkerLoadModel
    fast = [(d, d * 6, 0.0, 0.0, 0.001 + 1e-5 * d) for d in (8, 16, 32, 64)]
    load = WorkerLoadModel(8)
    load.seed(0, fast, tp_size=1)
    load.seed(1, [(d, k, p, q, 2 * t) for d, k, p, q, t in fast], tp_size=1)    # the second's profile not added
    load.seed(2, [(d, k, p, q, 3 * t) for d, k, p, q, t in fast], tp_size=2)
    x = features(32, 192)
    assert load.models[0] is load.models[1] and load.models[2] is not load.models[0]
    assert load.models[1].predict(x) == pytest.approx(0.001 + 32e-5, rel=0.05)
    assert load.models[2].predict(x) == pytest.approx(3 * (0.001 + 32e-5), rel=0.05)
    load.forget(2)
    load.seed(2, fast, tp_size=1)
    assert load.models[2] is load.models[0]
    alone = WorkerLoadModel(8)          # no degree given: each worker its own model, as before
    alone.seed(0, fast)
    alone.seed(1, fast)
    assert alone.models[0] is not alone.models[1]


def test_a_request_alone_on_its_worker_moves_only_to_a_faster_instance():
    from dllm_server.scheduler.placement import WorkerLoad, keeps_request
    # alone on worker 0 (nothing else held or queued there): another TP1 that the step-time models call sooner is
    # no reason to lose the lease; a TP2 is, and a request sharing its worker moves as before
    loads = [WorkerLoad(0, "colocated", 0, 64, 64, True), WorkerLoad(1, "colocated", 0, 64, 64, True)]
    assert keeps_request(loads, "colocated", 0, 4, {0: 0.3, 1: 0.1}) is True
    faster = [loads[0], dataclasses.replace(loads[1], tp_size=2)]
    assert keeps_request(faster, "colocated", 0, 4, {0: 0.3, 1: 0.1}) is False
    assert keeps_request(faster, "colocated", 0, 4, {0: 0.3, 1: 0.29}) is True
    for busy in (dict(holding=1), dict(outstanding_prefill_tokens=512)):
        assert keeps_request([dataclasses.replace(loads[0], **busy), loads[1]], "colocated", 0, 4,
                             {0: 0.3, 1: 0.1}) is False


def test_the_front_counts_the_requests_each_worker_holds():
    s, sent, _ = make(["colocated", "colocated"], routing="completion")
    s.add(request("a"))
    s.add(request("b", seq=1))
    def counted_right() -> bool:       # every worker's count is the requests whose block it holds, the dead too
        return [w.holding for w in s.workers] == [sum(e.worker == w.worker_id for e in s.requests) for w in s.workers]
    assert sum(w.holding for w in s.workers) == 2 and counted_right()
    s.abort("a")
    assert sum(w.holding for w in s.workers) == 1 and counted_right()
    # a request's own block is left out of the load its lease is judged on
    entry = s.requests.get("b")
    assert s.workers.loads(minus=entry)[entry.worker].holding == 0
    lost = entry.worker
    s.on_worker_lost([lost], "test")
    assert s.workers[lost].holding == 0 and counted_right()


def test_slo_class_keeps_the_fast_instances_for_the_requests_that_need_them():
    from dllm_server.scheduler.placement import slo_class
    completion = {0: 0.10, 1: 0.11, 2: 0.30, 3: 0.31}       # 0, 1 fast; 2, 3 three times slower
    alone = {0: 0.10, 1: 0.10, 2: 0.30, 3: 0.28}            # 2 and 3 within CLASS_TIE: one class
    assert slo_class(completion, alone, float("inf")) == {2, 3}        # no SLO: the slow class
    assert slo_class(completion, alone, 1.0) == {2, 3}                 # loose: 0.31 <= 0.5 x 1.0
    assert slo_class(completion, alone, 0.4) == {0, 1}                 # tight: only the fast fit half of 0.4
    assert slo_class(completion, alone, 0.1) == {0, 1, 2, 3}           # fits nowhere: the sooner of them all
    busy = {**completion, 0: 0.25, 1: 0.25}                            # the fast ones queued past the budget
    assert slo_class(busy, alone, 0.4) == {0, 1, 2, 3}


def test_slo_class_routing_sends_a_loose_request_to_the_slow_worker_and_a_tight_one_to_the_fast():
    s, sent, _ = make(["colocated", "colocated"], routing="slo-class")
    fast = [(d, d * 6, 0.0, 0.0, 0.001 + 1e-5 * d) for d in (8, 16, 32, 64)]
    s.load.seed(0, [(d, k, p, q, 3 * t) for d, k, p, q, t in fast])
    s.load.forget(1)
    s.load.seed(1, fast, tp_size=4)                  # a TP4 instance beside a TP1
    s.add(request("loose", slo_ms=60_000))
    s.add(request("tight", seq=1, slo_ms=60))         # 3 blocks: 20 ms a block, the fast one takes ~5 ms
    s.add(request("none", seq=2))
    assert [w for w, _ in of(sent, SubmitBlock)] == [0, 1, 0]


def test_routing_ties_go_to_the_worker_running_fewest_requests():
    from dllm_server.scheduler.placement import WorkerLoad, pick_by_completion, pick_prefill_worker
    # no prefill queued anywhere (every idle worker reads 0): the fewest running requests, not the lowest id
    loads = [WorkerLoad(w, "colocated", 0, 64, 64, True, active) for w, active in enumerate((2, 0, 1))]
    assert pick_prefill_worker(loads, "colocated", 4, 0) == 1
    # predicted completions within 5 % are a tie, broken the same way; a real difference still decides
    assert pick_by_completion(loads, {0: 0.100, 1: 0.104, 2: 0.2}, pages_needed=4) == 1
    assert pick_by_completion(loads, {0: 0.100, 1: 0.106, 2: 0.2}, pages_needed=4) == 0


def test_completion_estimates_price_the_next_block_not_the_last_iteration():
    from dllm_server.config import WorkerPolicy
    from dllm_server.costmodel.step_time import features
    from dllm_server.costmodel.worker_speed import WorkerLoadModel
    from dllm_server.messages import LoadReport
    load = WorkerLoadModel(8)
    for w in (0, 1, 2):                                  # 2 ms + 1 ms a row; a 100-token recompute adds 10 ms
        for n in (1, 2, 4, 8):
            load.models[w].add(features(8 * n, 100 * n), 0.002 + 0.001 * n)
            load.models[w].add(features(8 * n, 100 * n, 100, 100 ** 2), 0.012 + 0.001 * n)
    pol = WorkerPolicy(256, 64, 0.125)

    def report(w, active, prefill_tokens, outstanding=0):
        rows = max(1, active)
        return LoadReport(w, outstanding, active, 64, 0, 8 * rows + prefill_tokens, 5, 0.01, 0.01, prefill_tokens,
                          int(prefill_tokens > 0), pol, 100 * rows, prefill_tokens ** 2)
    load.observe(0, report(0, 0, 100))                   # idle, its last iteration ran a re-prefill
    load.observe(1, report(1, 0, 0))                     # idle
    load.observe(2, report(2, 4, 0))                     # four requests running
    st = request("x").state
    st.stats.steps_per_block = [4]                       # four forwards a block
    est = load.completion_estimates(range(3), st)
    assert est[0] == pytest.approx(est[1])               # a one-off re-prefill is not every forward's cost
    # four running requests each re-prefill once in four forwards: every forward carries one, on top of their rows
    rows_alone = 4 * load.iteration_s(2, extra_rows=1, extra_keys=27, decode_only=True)
    assert est[2] > 1.2 * rows_alone and rows_alone > est[1]
    # the front's own count of prefill tokens sent since the report replaces the report's
    queued = load.completion_estimates(range(3), st, {1: 512})
    assert queued[1] > est[1] and queued[0] == pytest.approx(est[0])


def test_deadline_scheduling_sends_each_block_its_place_in_line_and_moves_a_late_one_back():
    s, sent, clock = make(["colocated"], scheduling_policy="deadline", default_deadline_s=30.0)
    tight, free = request("tight", slo_ms=2000.0), request("free", seq=1)
    s.add(tight), s.add(free)
    s.tick()
    first = {m.request_id: m.policy.priority for _, m in sent if isinstance(m, SubmitBlock)}
    t0 = tight.arrived_at
    assert first == {"tight": t0 + 2.0, "free": free.arrived_at + 30.0}
    sent.clear()
    clock.t += 5.0                                   # past the tight request's deadline: late, it yields
    s.tick()
    moved = [m for _, m in sent if isinstance(m, ReviseBlock)]
    assert [(m.request_id, m.policy.priority) for m in moved] == [("tight", t0 + 2.0 + 30.0)]
    assert s.counters.requests_yielded == 1
    s.tick()                                         # once is enough
    assert s.counters.requests_yielded == 1
