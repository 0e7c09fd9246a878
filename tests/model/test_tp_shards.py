"""Tensor-parallel sharding (model/tp.py) without processes: each rank's fused projections are
exactly its heads' / rows' / columns' slices of the full checkpoint, the ranks' parts reassemble
the full weights bit for bit, replicated tensors are whole, and a rank holds about 1/d of the
sharded layers. Degrees that do not divide the heads are refused before any weights load."""
import pytest
import torch

from dllm_server.model.layers import Projections, ReducedLinear, ServingLinear
from dllm_server.model.loader import load_model
from dllm_server.config import ServerConfig, tp_degree_error
from dllm_server.model.tp import TPShard


def _layers(model):
    return [m for m in model.modules() if isinstance(m, Projections)]


def _full_and_ranks(path, d):
    plain, args, _ = load_model(path, dtype="float32", fuse=False)
    ranks = [load_model(path, dtype="float32", tp=TPShard(r, d, all_reduce=lambda t: None))[0] for r in range(d)]
    return plain, args, ranks


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_rank_shards_reassemble_the_full_weights_exactly(request, arch):
    path = request.getfixturevalue(f"tiny_{arch}")
    d = 2
    plain, args, ranks = _full_and_ranks(path, d)
    hd = args.head_dim
    for li, full in enumerate(_layers(plain)):
        n = full.names
        parts = [_layers(r)[li] for r in ranks]
        if "q" in n:
            q, k, v = (getattr(full, n[x]) for x in "qkv")
            qs, ks = args.num_heads // d * hd, args.num_kv_heads // d * hd
            for r, p in enumerate(parts):
                assert p.shape == (args.num_heads // d, args.num_kv_heads // d, hd)
                want = torch.cat([q.weight[r * qs:(r + 1) * qs], k.weight[r * ks:(r + 1) * ks],
                                  v.weight[r * ks:(r + 1) * ks]])
                assert torch.equal(p.qkv.weight_t.t(), want)          # split by heads, then fused
                if q.bias is not None:
                    assert torch.equal(p.qkv.bias, torch.cat([q.bias[r * qs:(r + 1) * qs],
                                       k.bias[r * ks:(r + 1) * ks], v.bias[r * ks:(r + 1) * ks]]))
            # reassembled: the ranks' q rows in order are the whole q
            assert torch.equal(torch.cat([p.qkv.weight_t.t()[:qs] for p in parts]), q.weight)
            o = getattr(full, n["o"])
            got = [getattr(p, n["o"]) for p in parts]
            assert all(isinstance(g, ReducedLinear) for g in got)
            assert torch.equal(torch.cat([g.weight_t.t() for g in got], dim=1), o.weight)   # by input columns
        if "gate" in n:
            gate, up, down = (getattr(full, n[x]) for x in ("gate", "up", "down"))
            m = gate.out_features // d
            for r, p in enumerate(parts):
                g_r, u_r = p.gate_up.weight_t.t().chunk(2)
                assert torch.equal(g_r, gate.weight[r * m:(r + 1) * m]) and torch.equal(u_r, up.weight[r * m:(r + 1) * m])
            assert torch.equal(torch.cat([getattr(p, n["down"]).weight_t.t() for p in parts], dim=1), down.weight)
    # replicated: embeddings, norms and the head are whole on every rank
    full_state = plain.state_dict()
    for r in ranks:
        replicated = [n for n in r.state_dict() if "norm" in n or n.endswith(("wte.weight", "embed_tokens.weight",
                                                                               "ln_f.weight"))]
        assert len(replicated) >= 2 * args.num_layers + 2
        for name in replicated:
            assert torch.equal(r.state_dict()[name], full_state[name]), name


def test_a_rank_holds_half_of_the_sharded_layers(tiny_dream):
    one = load_model(tiny_dream, dtype="float32")[0]
    half = load_model(tiny_dream, dtype="float32", tp=TPShard(1, 2, all_reduce=lambda t: None))[0]

    def sharded_bytes(model):
        return sum(p.numel() * p.element_size() for m in _layers(model) for p in m.parameters())
    assert sharded_bytes(half) <= 0.6 * sharded_bytes(one)
    assert any(isinstance(m, ServingLinear) for m in half.modules())


def test_degrees_that_do_not_divide_the_heads_are_named():
    assert tp_degree_error(2, 32, 32) is None and tp_degree_error(4, 28, 4) is None
    msg = tp_degree_error(8, 28, 4)
    assert "28 attention heads and 4 KV heads" in msg and "(allowed: 1, 2, 4)" in msg
    assert "(allowed: 1, 2, 4, 8, 16, 32)" in tp_degree_error(3, 32, 32)
    with pytest.raises(ValueError, match="tensor_parallel_size: 8 does not divide the model's 28"):
        ServerConfig(tensor_parallel_size=8).check_model_heads(28, 4)
    with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide"):
        from dllm_server.model.args import ModelArgs
        ModelArgs("llada", 64, 2, 4, 4, 128, 262, 320, 1e4, 1e-5, 64, 261, 256, False, False, 0, tp_size=3)
