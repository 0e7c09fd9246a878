"""Layer-wise KV streaming between two real processes over gloo: the receiver has layer 0 while
the sender's prefill forward is still running, the received KV equals the sender's, a forward
that fails mid-way still completes the receiver's posted receives, and a receiver without pages
drains the data. Contiguous and gathered pages on both ends."""
import dataclasses
import queue
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dllm_server.config import ServerConfig
from dllm_server.decoding.params import BlockPolicy, SamplingParams
from dllm_server.server_process import free_port
from dllm_server.messages import BlockDone, InstallKV, PrefillDone, ReceiveKV, RequestFailed, SubmitBlock
from dllm_server.worker.build import build_core
from dllm_server.worker.handoff import receiving_owner

PAGE, PAGES = 8, 20
LENGTHS = {"a": 20, "b": 24}          # canvas tokens: 3 pages each


def _core(model_path, rank, emit=None):
    config = ServerConfig(block_length=8, dtype="float32", page_size=PAGE, num_pages=PAGES).worker_config()
    return build_core(config, model_path, torch.device("cpu"), rank, kv_ranks=((0,), (1,)), emit=emit)


def _fragment(pool, free_pages):
    """Own every page with a filler, then free `free_pages`: later allocations land exactly there."""
    for p in range(PAGES):
        pool.allocate(f"fill{p}", PAGE)
    for p in free_pages:
        pool.free(f"fill{p}")


def _block(rid, info, dst):
    n = LENGTHS[rid]
    canvas = torch.full((n,), info.mask_id, dtype=torch.int64)
    canvas[: n - 16] = torch.arange(1, n - 15)
    params = SamplingParams(max_tokens=16, ignore_eos=True).resolve(8, 7)
    return SubmitBlock(rid, 0, n - 16, canvas, params, BlockPolicy(0.9), (), ord(rid), handoff=True, stream_to=dst)


def _kv_of(pool, alloc, n):
    idx = slice(alloc.slot_base, alloc.slot_base + n) if alloc.slot_ids is None else alloc.slot_ids[:n]
    return torch.stack([torch.stack([layer.k[idx], layer.v[idx]]) for layer in pool.layers])


def _sender(model_path, to_recv, from_recv, scenario):
    core, args = _core(model_path, 0, emit=lambda msgs: to_recv.put(("sent", msgs)))
    _fragment(core.pool, [0, 1, 2, 5, 7, 9])            # a: pages 0-2 (a view), b: 5, 7, 9 (a gather)
    last = core.stepper.runner.model.model.transformer["blocks"][-1]

    def before_last_layer(*_):
        # The forward cannot end before the receiver holds layer 0: only a send issued from
        # inside the forward can satisfy this.
        assert from_recv.get(timeout=20) == "layer0"
        if scenario == "fail":
            raise RuntimeError("boom in the last layer")

    last.register_forward_pre_hook(before_last_layer)
    for rid in LENGTHS:
        assert core.submit(_block(rid, args, dst=1)) == []
    out = core.step()
    if scenario == "fail":
        assert sorted(m.request_id for m in out if isinstance(m, RequestFailed)) == ["a", "b"]
    else:
        assert sorted(m.request_id for m in out if isinstance(m, (PrefillDone, BlockDone))) == ["a", "b"]
        assert not core.tasks                        # the streamed blocks left with their KV
    sent = {}
    for owner in core.pool.owners():
        if "\x00out" in owner:
            rid = owner.split("\x00")[0]
            sent[rid] = _kv_of(core.pool, core.pool._owner[owner], LENGTHS[rid]).numpy()   # pickled by value
    assert sorted(sent) == ["a", "b"]
    assert core.pool._owner[next(o for o in core.pool.owners() if o.startswith("b\x00"))].slot_ids is not None
    to_recv.put(("kv", sent))
    done = []                                       # a transport error would raise here
    while len(done) < 2:
        done += core.poll_transfers()
    assert all(m.is_sender for m in done) and not any("\x00out" in o for o in core.pool.owners())


def _receiver(model_path, from_send, to_send, scenario):
    core, info = _core(model_path, 1)
    waiter = core.handoffs.transport.waiter
    _fragment(core.pool, [1, 3, 5, 10, 11, 12] if scenario != "refuse" else [4])
    kind, msgs = from_send.get(timeout=20)
    assert kind == "sent" and len(msgs) == 1
    m = msgs[0]
    core.handle(ReceiveKV(m.src_worker, m.request_ids, m.block_indices, m.canvas_lens, (True, True), m.tag_base))
    if scenario == "refuse":
        assert not core.handoffs.arrivals and [t.ok for t in waiter.pending] == [False, False]
    else:
        allocs = [core.pool._owner[receiving_owner(rid, 0)] for rid in m.request_ids]
        assert allocs[0].slot_ids is None and allocs[1].slot_ids is not None   # a contiguous, b gathered
    # Layer 0's K of the first request lands in its buffer while the sender is still in its forward.
    first = waiter.pending[0].buffers[0]
    deadline = time.monotonic() + 20
    while not bool(first.abs().sum() > 0) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert bool(first.abs().sum() > 0), "layer 0 did not arrive during the sender's forward"
    to_send.put("layer0")
    done = []                                       # a transport error would raise here
    while len(done) < 2:
        done += core.poll_transfers()               # received: staged K/V moved into their slots
    kind, sent = from_send.get(timeout=20)
    if scenario == "refuse":
        assert [m.ok for m in done] == [False, False]
        return
    for m in done:
        got = _kv_of(core.pool, core.pool._owner[receiving_owner(m.request_id, 0)], LENGTHS[m.request_id])
        assert torch.equal(got, torch.from_numpy(sent[m.request_id])), m.request_id
    # InstallKV: the blocks become decodable, on the pages the KV arrived in.
    for rid in LENGTHS:
        core.handle(InstallKV(dataclasses.replace(_block(rid, info, None), handoff=False, step_offset=1)))
    assert not core.handoffs.arrivals and sorted(core.ready) == ["a", "b"] and core.step()
    core.pool.check_integrity()


def _rank(rank, port, model_path, q01, q10, scenario, errors):
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        torch.set_num_threads(1)
        if rank == 0:
            _sender(model_path, q01, q10, scenario)
        else:
            _receiver(model_path, q01, q10, scenario)
    except BaseException as exc:   # reported to the test process
        import traceback
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise SystemExit(1) from exc
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("scenario", ["ok", "fail", "refuse"])
def test_layerwise_stream_between_processes(tiny_llada, scenario):
    ctx = mp.get_context("spawn")
    q01, q10, errors = ctx.Queue(), ctx.Queue(), ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, tiny_llada, q01, q10, scenario, errors)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    msgs = []
    while True:
        try:
            msgs.append(errors.get(timeout=0.5))
        except queue.Empty:
            break
    assert not alive and not msgs and all(p.exitcode == 0 for p in procs), "\n".join(msgs)
