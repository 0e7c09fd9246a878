"""A packed forward (prefills and cached decode steps, contiguous and gathered pages) at TP=2, two
real processes over gloo with the leader's plans driving the follower (worker/tp.py), equals the
same forward at TP=1: within 1e-5 in float32 (two partial sums and one add per projection) and
1e-12 in float64 (the model's float64 logits, before the runner's cast for sampling), both
architectures."""
import pytest
import torch

from .tp_ranks import build, packed_forwards, run_ranks


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_tp2_packed_forward_equals_tp1(request, arch):
    path = request.getfixturevalue(f"tiny_{arch}")
    dtypes = ["float32", "float64"]
    got = run_ranks(path, dtypes)
    for dtype, tol in (("float32", 1e-5), ("float64", 1e-12)):
        runner, pool, args = build(path, dtype, None)
        want = packed_forwards(runner, pool, args)
        assert got[f"follower-1-{dtype}"] == 2           # the follower ran both forwards from the plans
        assert len(want) == len(got[dtype]) == 2
        for w, g in zip(want, map(torch.from_numpy, got[dtype])):
            assert w.shape == g.shape and w.dtype == g.dtype == getattr(torch, dtype)   # before any cast
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)
