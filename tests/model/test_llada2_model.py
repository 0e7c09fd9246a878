"""LLaDA2 (model/llada2.py, model/moe.py) on the tiny seeded checkpoint in the released layout (model/tiny.py).
Oracles: (a) the MoE layer against transformers' DeepseekV3MoE / DeepseekV3TopkRouter holding the same weights,
ties and the expert bias included; (b) the whole model's logits against llada2_reference.ReferenceLLaDA2 (stock
transformers parts, plain attention under the block-causal mask, no cache). Then the paged path, tensor-parallel
shards and forward, the config's refusals and the chat template."""
import json
from pathlib import Path

import pytest
import torch

from dllm_server.checkpoint import architecture_of, head_counts, read_config
from dllm_server.model import llada2
from dllm_server.model.args import MoEArgs
from dllm_server.model.attention import DenseBatch
from dllm_server.model.layers import RMSNorm
from dllm_server.model.loader import load_model
from dllm_server.model.moe import SparseMoE, route
from dllm_server.model.tp import TPShard
from dllm_server.request.tokenize import Tokenizer

from .llada2_reference import ReferenceLLaDA2, deepseek_config, stock_moe
from .sdar_reference import block_causal_additive
from .test_sdar_model import _norm_in_float32, _ulps
from .tp_ranks import build, packed_forwards, run_ranks

transformers = pytest.importorskip("transformers")
B, L = 32, 75                    # LLaDA2's block; a canvas ending inside its third block
MOE = MoEArgs(num_experts=8, top_k=2, expert_hidden=16, num_shared=1, first_dense=0, n_group=4, topk_group=2,
              routed_scaling=2.5, norm_topk=True, expert_bias=True)
H = 24


def _ours(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids, torch.arange(ids.numel()), DenseBatch(1, block_size=B), None, torch.arange(ids.numel()))


def _reference(folder: str, dtype: torch.dtype, ids: torch.Tensor) -> torch.Tensor:
    ref = ReferenceLLaDA2(folder, dtype)
    pos = torch.arange(ids.numel())
    return ref(input_ids=ids[None], attention_mask=block_causal_additive(pos, B, dtype), position_ids=pos[None])


def _moe_pair(seed: int, dtype: torch.dtype = torch.float64):
    """Our SparseMoE with random weights, and stock DeepseekV3MoE holding the same tensors."""
    g = torch.Generator().manual_seed(seed)
    ours = SparseMoE(H, MOE)
    for p in ours.parameters():
        p.data = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
    ours.gate.expert_bias.data = torch.randn(MOE.num_experts, generator=g) * 0.1
    cfg = {"hidden_size": H, "intermediate_size": 4 * H, "moe_intermediate_size": MOE.expert_hidden,
           "num_experts": MOE.num_experts, "num_experts_per_tok": MOE.top_k, "n_group": MOE.n_group,
           "topk_group": MOE.topk_group, "num_shared_experts": MOE.num_shared, "routed_scaling_factor": 2.5,
           "rms_norm_eps": 1e-6}
    state = {"m." + k: v for k, v in ours.state_dict().items()}
    return ours.to(dtype).eval(), stock_moe(deepseek_config(cfg), state, "m.", MOE.num_experts).to(dtype).eval()


def _router_ulps(want: torch.Tensor) -> float:
    """What a float32 router's rounding moves a float64 output by: 8 float32 ulps of its scale."""
    return 8 * torch.finfo(torch.float32).eps * want.abs().amax().item()


def _compare_moe(ours: SparseMoE, stock, x: torch.Tensor) -> None:
    with torch.inference_mode():
        _, stock_w, stock_ids = stock.gate(x)
        ids, w = route(ours.gate(x), ours.gate.expert_bias, MOE)
        assert torch.equal(ids.sort(-1).values, stock_ids.sort(-1).values)          # the same experts
        torch.testing.assert_close(w.gather(1, ids.argsort(-1)), stock_w.gather(1, stock_ids.argsort(-1)),
                                   rtol=1e-6, atol=0)   # the router runs in float32 as the stock one does: a few ulps
        # apart where the CPU's float32 matmul blocks the 24-wide dot product differently (bit for bit on Intel)
        torch.testing.assert_close(ours(x), stock(x[None])[0], rtol=0, atol=_router_ulps(stock(x[None])[0]))


def test_moe_layer_equals_transformers_deepseek_v3_moe():
    """float64, 200 random tokens: the router's choice and weights are bit-identical (both float32, the same ops),
    the output within 1e-13 (experts' rows summed in another order: ours per token over its k, stock by index_add
    in expert order). The expert bias decides the choice, not the weights: zeroing it changes some choices."""
    ours, stock = _moe_pair(0)
    x = torch.randn(200, H, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    _compare_moe(ours, stock, x)
    ours.fuse()                                  # serving path: the router as a float32 ServingLinear
    _compare_moe(ours, stock, x)
    with torch.inference_mode():
        biased, _ = route(ours.gate(x), ours.gate.expert_bias, MOE)
        plain, _ = route(ours.gate(x), None, MOE)
    assert not torch.equal(biased.sort(-1).values, plain.sort(-1).values)


def test_moe_ties_break_as_transformers_does():
    """Ties in expert and group scores: two identical router rows in one group (experts 2 and 3), a group
    whose rows copy another's (experts 6, 7 = 0, 1) with the same bias, and all-zero tokens (every score 0.5 +
    bias). Both sides rank with torch.topk over bit-identical float32 scores, so they pick the same experts."""
    ours, stock = _moe_pair(2)
    with torch.no_grad():
        for moe in (ours.gate, stock.gate):
            w = moe.weight
            w[3] = w[2]
            w[6], w[7] = w[0], w[1]
        for bias in (ours.gate.expert_bias, stock.gate.e_score_correction_bias):
            bias[3], bias[6], bias[7] = bias[2], bias[0], bias[1]
    x = torch.randn(64, H, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x[:8] = 0.0
    _compare_moe(ours, stock, x)


def test_routing_rules():
    """route() by hand: only kept groups' experts are chosen; weights are the unbiased sigmoid scores,
    normalised and scaled."""
    logits = torch.tensor([[4.0, 3.0, -5.0, -5.0, 0.0, 0.0, 2.0, 2.5]])
    m = MoEArgs(8, 2, 4, 0, 0, 4, 1, 2.0, True, True)
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0])       # makes group 3 the best group
    ids, w = route(logits, bias, m)
    assert sorted(ids[0].tolist()) == [6, 7]
    s = torch.sigmoid(torch.tensor([2.0, 2.5]))
    torch.testing.assert_close(w[0].sort().values, (2.0 * s / s.sum()).sort().values)
    ids, _ = route(logits, None, m)
    assert sorted(ids[0].tolist()) == [0, 1]
    ids, _ = route(logits, bias - 2.0, m)          # every biased score negative: dropped groups stay out
    assert sorted(ids[0].tolist()) == [6, 7]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logits_equal_the_reference_under_the_block_causal_mask(tiny_llada2, dtype, monkeypatch):
    """Within 2e-5 of the stock-parts reference (logits about 20; float32 rounding of the rotary tables and of
    the norms' scaling, as for SDAR); aligning both roundings leaves float64 within 64 ulps of the logits' scale."""
    name = str(dtype).removeprefix("torch.")
    fused, args, _ = load_model(tiny_llada2, dtype=name)
    plain, _, _ = load_model(tiny_llada2, dtype=name, fuse=False)
    assert (args.block_size, args.rope_dim, args.head_dim) == (B, 8, 16)
    ids = torch.randint(0, 256, (L,), generator=torch.Generator().manual_seed(0))
    want = _reference(tiny_llada2, dtype, ids).logits[0]
    got = _ours(fused, ids)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    # the fused router's float32 matmul (W^T contiguous) may round apart from F.linear's on some CPUs (AMD EPYC: by
    # ~1 float32 ulp of the logits' scale; bit for bit on the Intel CPU of earlier runs): fused against plain
    # allows that, the rest is exact
    torch.testing.assert_close(got, _ours(plain, ids), rtol=0, atol=_router_ulps(want) if dtype == torch.float64
                               else 1e-5)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    if dtype == torch.float64:
        inv = 1.0 / (args.rope_theta ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
        emb = torch.cat([torch.arange(args.max_len).float()[:, None] * inv] * 2, dim=-1)
        plain.rotary.cos, plain.rotary.sin = emb.cos(), torch.cat([-emb.sin()[:, :4], emb.sin()[:, 4:]], -1)
        monkeypatch.setattr(RMSNorm, "forward", _norm_in_float32)
        torch.testing.assert_close(_ours(plain, ids), want, rtol=0, atol=_ulps(want))   # F.linear routers, as stock


def test_a_later_block_leaves_earlier_blocks_unchanged(tiny_llada2):
    model, _, _ = load_model(tiny_llada2, dtype="float64")
    ids = torch.randint(0, 256, (L,), generator=torch.Generator().manual_seed(4))
    other = ids.clone()
    other[70] = (other[70] + 1) % 256
    a, b = _ours(model, ids), _ours(model, other)
    assert torch.equal(a[:64], b[:64])
    assert (a[64:70] - b[64:70]).abs().amax() > 1e-6          # bidirectional inside the block


def test_config_layout_and_refusals(tiny_llada2):
    cfg = read_config(tiny_llada2)
    assert cfg["architectures"] == ["LLaDA2MoeModelLM"] and "mask_token_id" not in cfg
    assert architecture_of({"model_type": "llada2_moe"}) == "LLaDA2MoeModelLM" and head_counts(cfg) == (4, 2)
    model, args, _ = load_model(tiny_llada2, dtype="float32", fuse=False)
    names = set(model.state_dict())
    assert {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.expert_bias",
            "model.layers.1.mlp.experts.7.down_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight",
            "model.layers.1.attention.query_key_value.weight", "model.layers.1.attention.query_layernorm.weight",
            "model.word_embeddings.weight", "lm_head.weight"} <= names
    assert args.mask_id == Tokenizer(tiny_llada2).hf.convert_tokens_to_ids("<|mask|>")
    for key, bad in (("score_function", "softmax"), ("moe_router_topk_method", "greedy"), ("hidden_act", "gelu")):
        with pytest.raises(ValueError, match=f"^config: {key} '{bad}' is not supported"):
            llada2.args_from_config({**cfg, "mask_token_id": 1, key: bad})
    with pytest.raises(ValueError, match="n_group"):
        llada2.args_from_config({**cfg, "mask_token_id": 1, "n_group": 3})
    with pytest.raises(ValueError, match="mask_token_id"):
        llada2.args_from_config(cfg)


def test_a_bad_routing_option_fails_at_load_in_one_line(tiny_llada2, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    for f in Path(tiny_llada2).iterdir():
        (folder / f.name).symlink_to(f)
    cfg = read_config(tiny_llada2)
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(json.dumps({**cfg, "score_function": "softmax"}))
    with pytest.raises(ValueError) as err:
        load_model(folder)
    assert str(err.value) == "config: score_function 'softmax' is not supported (LLaDA2 uses 'sigmoid')"


def test_chat_template(tiny_llada2):
    tok = Tokenizer(tiny_llada2)
    ids = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert tok.hf.decode(ids, skip_special_tokens=False) == (
        "<role>SYSTEM</role>Be brief.<|role_end|><role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>")


def test_tp2_shards_every_expert_and_the_fused_qkv(tiny_llada2):
    plain, args, _ = load_model(tiny_llada2, dtype="float32", fuse=False)
    full = plain.state_dict()
    hd, e = args.head_dim, args.moe.expert_hidden // 2
    for r in range(2):
        rank, _, _ = load_model(tiny_llada2, dtype="float32", tp=TPShard(r, 2, all_reduce=lambda t: None))
        at = rank.model.layers[1].attention
        qkv = full["model.layers.1.attention.query_key_value.weight"]
        q, k, v = qkv[:4 * hd], qkv[4 * hd:6 * hd], qkv[6 * hd:]
        want = torch.cat([q[r * 2 * hd:(r + 1) * 2 * hd], k[r * hd:(r + 1) * hd], v[r * hd:(r + 1) * hd]])
        assert torch.equal(at.qkv.weight_t.t(), want)
        moe = rank.model.layers[1].mlp
        assert moe.reduce is not None and moe.experts[3].reduce is None and moe.shared_experts.reduce is None
        up = full["model.layers.1.mlp.experts.3.up_proj.weight"][r * e:(r + 1) * e]
        assert torch.equal(moe.experts[3].gate_up.weight_t.t()[e:], up)
        assert rank.model.layers[0].mlp.reduce is not None                   # the dense layer reduces itself


def test_tp2_packed_forward_equals_tp1(tiny_llada2):
    """Two processes over gloo (tests/model/tp_ranks.py): prefills and block steps on cached KV, every rank
    routing the same tokens to its slice of every expert; float32 within 1e-5."""
    got = run_ranks(tiny_llada2, ["float32"])
    runner, pool, args = build(tiny_llada2, "float32", None)
    for w, g in zip(packed_forwards(runner, pool, args), map(torch.from_numpy, got["float32"])):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_moe_models_decode_eagerly_on_cuda(tiny_llada2, tiny_sdar):
    """The grouped MoE reads its per-expert counts on the host, which a CUDA graph capture cannot hold: decode graphs
    stay off for MoE checkpoints and on for dense ones (decided from the config; no GPU needed)."""
    from dllm_server.config import ServerConfig
    from dllm_server.model.loader import load_model
    from dllm_server.worker.model_step import uses_decode_graphs
    cuda, worker = torch.device("cuda"), ServerConfig().worker_config()
    moe_args, dense_args = load_model(tiny_llada2, "float32")[1], load_model(tiny_sdar, "float32")[1]
    assert not uses_decode_graphs(cuda, worker, moe_args)
    assert uses_decode_graphs(cuda, worker, dense_args)
    assert not uses_decode_graphs(torch.device("cpu"), worker, dense_args)
    assert not uses_decode_graphs(cuda, ServerConfig(enforce_eager=True).worker_config(), dense_args)


def _kernel_up_gate(x, ids, scales, fc1, fc2, out_dtype, quant_scales):
    """A stand-in for FlashInfer's cutlass_fused_moe (no GPU here), written to its documented contract with fc1's
    halves as [up; gate]: out[t] = sum_j scales[t, j] * fc2[e] (silu(gate) * up), e = ids[t, j]."""
    assert ids.dtype == torch.int32 and scales.dtype == torch.float32 and quant_scales == []
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            up, gate = (fc1[e].float() @ x[t].float()).chunk(2)
            out[t] += scales[t, j] * (fc2[e].float() @ (torch.nn.functional.silu(gate) * up))
    return out.to(out_dtype)


def test_a_fused_moe_kernel_replaces_the_experts_only_where_it_agrees(tiny_llada2):
    from dllm_server.model.loader import load_model
    from dllm_server.model.moe import SparseMoE, use_fused_experts
    model = load_model(tiny_llada2, "float32")[0]
    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    x = torch.randn(40, layers[0].gate.serving.weight_t.shape[0], generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        before = [layer(x) for layer in layers]
        assert use_fused_experts(model, lambda *a, **k: _kernel_up_gate(*a, **k) * 1.5) == 0    # wrong: kept
        assert use_fused_experts(model, lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no sm90"))) == 0
        assert all(layer.fused is None and layer.experts is not None for layer in layers)
        assert use_fused_experts(model, _kernel_up_gate) == len(layers) > 0
        assert all(layer.experts is None and layer.fused.up_first for layer in layers)    # the order it found
        for layer, want in zip(layers, before):
            torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
