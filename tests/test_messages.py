"""Every message that crosses a process boundary is plain data: it survives a pickle round trip
(plain pickle and torch.multiprocessing's) and compares equal afterwards."""
import dataclasses
import io
import pickle

import torch
from multiprocessing.reduction import ForkingPickler

import torch.multiprocessing  # noqa: F401  (registers its tensor reductions with ForkingPickler)

from dllm_server import messages as M
from dllm_server.config import ServerConfig
from dllm_server.decoding.params import BlockPolicy, SamplingParams

PARAMS = SamplingParams(max_tokens=16, temperature=0.7, seed=3).resolve(ServerConfig().block_length, 5)
POLICY = BlockPolicy(0.8, None, 4)
CANVAS = torch.arange(24, dtype=torch.int64)
SUBMIT = M.SubmitBlock("r1", 1, 8, CANVAS, PARAMS, POLICY, (2, 5), 7, 1, True, 3, BlockPolicy(0.5))
INFO = M.ModelInfo("llada", 262, 320, 261, 256, 1024, 64, 2, 4, 4, 16, 128)
INVARIANCE = M.RowInvariance(False, (1, 2, 32), ((320, 960),), ("320->960: 2 of 64 rows",), 1, 0.01)
SAMPLES = [
    M.WorkerSpec(0, "colocated", "cpu", 1, "/m", 1, 0, (1,)), INFO, SUBMIT,
    M.ContinueBlock("r1", 1, POLICY), M.ContinueBlock("r1", 2, None), M.ReviseBlock("r1", 1, POLICY), M.Evict("r1", 2), M.Evicted("r1", 2, True),
    M.SetPolicy(ServerConfig().worker_policy()), M.HandoffKV("r1", 2),
    M.ReceiveKV(0, ("a", "b"), (0, 1), (20, 24), (True, False), 64), M.InstallKV(SUBMIT), M.Shutdown(), M.Abort("r1"),
    M.StepDelta("r1", 1, 2, (9, 10), (65, 66), 3), M.BlockDone("r1", 1, 4, False, True, POLICY),
    M.RequestFailed("r1", "boom"), M.KVSent(0, 1, ("a",), (0,), (20,), 0), M.PrefillDone("r1", 0, 1),
    M.HandoffDone("r1", 0, 1, False, True, 1024, 0.5),
    M.LoadReport(0, 10, 2, 5, 3, 40, 7, 0.1, 0.05, 24, 1, ServerConfig().worker_policy()),
    M.WorkerReady(0, 64, 16, INFO, row_invariance=INVARIANCE, tp_size=2, rank_rss_mb=(300.0, 290.0)), INVARIANCE,
    M.WorkerFailed(0, "traceback"),
]


def _equal(a, b) -> bool:
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(_equal(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_every_message_type_has_a_sample():
    defined = {v for v in vars(M).values() if isinstance(v, type) and dataclasses.is_dataclass(v)
               and v.__module__ == M.__name__}
    assert defined == {type(s) for s in SAMPLES}


def test_messages_survive_pickle_round_trips():
    for msg in SAMPLES:
        assert _equal(pickle.loads(pickle.dumps(msg)), msg), type(msg).__name__
        buf = io.BytesIO()
        ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(msg)      # what torch.multiprocessing queues use
        assert _equal(pickle.loads(buf.getvalue()), msg), type(msg).__name__


def test_messages_hold_no_model_or_worker_objects():
    def walk(v):
        if dataclasses.is_dataclass(v):
            for f in dataclasses.fields(v):
                yield from walk(getattr(v, f.name))
        elif isinstance(v, (tuple, list)):
            for x in v:
                yield from walk(x)
        else:
            yield v
    for msg in SAMPLES:
        for leaf in walk(msg):
            assert isinstance(leaf, (str, int, float, bool, type(None), torch.Tensor)), (type(msg).__name__, leaf)
