"""SDAR (model/sdar.py): the Qwen3 layout with a block-causal mask. Oracle: stock transformers
`Qwen3ForCausalLM` on the same tiny checkpoint (model/tiny.py), given the equivalent 4-D
block-causal additive mask. Then the paged path against the dense one (full canvas, and a block
step against the cached KV of the earlier blocks), the causal-across-blocks property, the chat
template, the config fallbacks, and tensor-parallel shards and forward."""
import json
from pathlib import Path

import pytest
import torch

from dllm_server.checkpoint import architecture_of, head_counts, read_config
from dllm_server.request.tokenize import Tokenizer
from dllm_server.model import sdar
from dllm_server.model.attention import DenseBatch, block_causal_mask
from dllm_server.model.layers import RMSNorm
from dllm_server.model.loader import load_model
from dllm_server.model.tiny import make_tiny_model
from dllm_server.model.tp import TPShard
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner

from .tp_ranks import build, packed_forwards, run_ranks

transformers = pytest.importorskip("transformers")
B, L = 4, 22                      # block width; canvas length (ends inside a block: a partial last block)


def _stock(path: str, dtype: torch.dtype, attn: str = "sdpa"):
    """Stock Qwen3ForCausalLM, loaded from the folder unchanged (model_type "sdar" only warns)."""
    model, info = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn,
                                                                output_loading_info=True)
    assert not any(info.values()), info               # no missing, unexpected or mismatched tensors
    return model.eval()


def _additive_mask(b: int, dtype: torch.dtype) -> torch.Tensor:
    """[b, 1, L, L]: 0 where a query may attend, the dtype's minimum elsewhere."""
    allowed = block_causal_mask(0, L, L, B, torch.device("cpu"))
    return torch.zeros(L, L, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min).expand(b, 1, L, L)


def _ours(model, ids: torch.Tensor, block_size: int = B) -> torch.Tensor:
    b, n = ids.shape
    with torch.inference_mode():
        return model(ids.reshape(-1), torch.arange(n).repeat(b), DenseBatch(b, block_size=block_size), None,
                     torch.arange(b * n)).view(b, n, -1)


def _use_stock_rotary_tables(ours, stock) -> None:
    """Our Rotary tables replaced by transformers' own cos/sin (sign folded as ours is)."""
    cos, sin = stock.model.rotary_emb(torch.zeros(1), torch.arange(ours.rotary.cos.shape[0])[None])
    half = cos.shape[-1] // 2
    ours.rotary.cos, ours.rotary.sin = cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)


def _norm_in_float32(self, x):
    """Qwen3RMSNorm's arithmetic: normalise in float32, round back, then scale in the input dtype."""
    x32 = x.float()
    return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def _ulps(want: torch.Tensor) -> float:
    """0 in float32 (bit-identical); 64 ulps of the logits' scale in float64 (kernel blocking)."""
    if want.dtype == torch.float32:
        return 0.0
    return 64 * torch.finfo(want.dtype).eps * float(want.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logits_equal_stock_qwen3_given_the_block_causal_mask(tiny_sdar, dtype, monkeypatch):
    """Within 2e-5 of stock Qwen3 (logits up to about 20; measured max 6.9e-6 in float32 and
    2.7e-6 in float64, i.e. a few float32 ulps). The whole difference is two known roundings,
    and aligning them makes the logits bit-identical:
    - rotary: our tables are computed in float64 and rounded once to float32; transformers
      computes them in float32 (inv_freq, position * inv_freq, cos/sin), a few ulps apart;
    - float64 only: Qwen3RMSNorm normalises in float32 and scales by the weight in float64,
      our RMSNorm normalises and scales in float32 for any non-float32 dtype (layers.py).
    Fused matmuls (Q|K|V, gate|up) change no bits in float32 (Intel and AMD measured). In float64
    some CPUs' GEMM kernels block the sum by the output width, so a fused matmul and the split ones
    differ by a few ulps (7.1e-15 measured on AMD EPYC, 0 on Intel): float64 is held to
    `_ulps`, 64 float64 ulps of the logits' scale, six orders below the unaligned difference."""
    stock = _stock(tiny_sdar, dtype)
    fused, args, _ = load_model(tiny_sdar, dtype=str(dtype).removeprefix("torch."))
    plain, _, _ = load_model(tiny_sdar, dtype=str(dtype).removeprefix("torch."), fuse=False)
    assert args.block_size == B and stock.config.head_dim == args.head_dim
    assert stock.config.rope_parameters["rope_theta"] == args.rope_theta
    ids = torch.randint(0, args.vocab_size, (3, L), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = stock(input_ids=ids, attention_mask=_additive_mask(3, dtype)).logits
    got = _ours(fused, ids)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    exact = _ulps(want)
    torch.testing.assert_close(got, _ours(plain, ids), rtol=0, atol=exact)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    _use_stock_rotary_tables(fused, stock)
    if dtype == torch.float64:
        monkeypatch.setattr(RMSNorm, "forward", _norm_in_float32)
    torch.testing.assert_close(_ours(fused, ids), want, rtol=0, atol=exact)


def test_logits_match_stock_eager_attention(tiny_sdar):
    """The other stock attention implementation (matmul, additive mask, softmax): float32,
    within the same 2e-5 (measured 7.6e-6; its softmax sums in another order than SDPA's)."""
    stock = _stock(tiny_sdar, torch.float32, attn="eager")
    ours, args, _ = load_model(tiny_sdar, dtype="float32")
    ids = torch.randint(0, args.vocab_size, (2, L), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = stock(input_ids=ids, attention_mask=_additive_mask(2, torch.float32)).logits
    torch.testing.assert_close(_ours(ours, ids), want, rtol=0, atol=2e-5)


def test_an_explicit_head_dim_other_than_hidden_over_heads(tmp_path):
    """Qwen3 configs carry head_dim; here 32 with hidden 64 and 4 heads (q_proj 64 -> 128)."""
    path = str(make_tiny_model(tmp_path / "hd32", arch="sdar", seed=4, head_dim=32))
    stock = _stock(path, torch.float32)
    ours, args, _ = load_model(path, dtype="float32")
    assert args.head_dim == 32 != args.hidden // args.num_heads
    assert stock.model.layers[0].self_attn.q_proj.out_features == 4 * 32
    ids = torch.randint(0, args.vocab_size, (2, L), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want = stock(input_ids=ids, attention_mask=_additive_mask(2, torch.float32)).logits
    torch.testing.assert_close(_ours(ours, ids), want, rtol=0, atol=2e-5)
    _use_stock_rotary_tables(ours, stock)
    assert torch.equal(_ours(ours, ids), want)


def _fragment(pool: KVPool) -> None:
    """Every other page taken: the next allocation gets gathered (non-contiguous) pages."""
    for k in range(pool.num_free_pages):
        pool.allocate(f"one-{k}", pool.page_size)
    for k in range(0, len(pool.owners()), 2):
        pool.free(f"one-{k}")


@pytest.mark.parametrize("gathered", [False, True])
def test_paged_block_steps_equal_the_dense_forward(tiny_sdar, gathered):
    """Through ModelRunner and a KVPool, float32, exactly (torch.equal): a full-canvas forward;
    a prefill of the 4 complete blocks, then a step feeding only block 4 against their cached
    KV (the canvas' later, unwritten slots are masked); and that step packed with another
    sequence's full forward. Each gives the dense block-causal forward's logits (the step over
    fewer keys within a few ulps, below)."""
    model, args, _ = load_model(tiny_sdar, dtype="float32")
    g = torch.Generator().manual_seed(3)
    canvas, other = (torch.randint(0, args.vocab_size, (24,), generator=g) for _ in range(2))
    canvas[18:] = args.mask_id
    dense = _ours(model, torch.stack([canvas, other]))

    def runner():
        pool = KVPool(args.num_layers, 32, 4, args.num_kv_heads, args.head_dim, torch.float32)
        if gathered:
            _fragment(pool)
        return ModelRunner(model, args, pool, torch.device("cpu")), pool

    run, pool = runner()
    alloc = pool.allocate("r", 24)
    assert (alloc.slot_ids is not None) == gathered
    assert torch.equal(run.forward([ForwardItem(canvas, alloc, 0, 24, 0, 24)])[0], dense[0])

    run, pool = runner()
    alloc, alloc2 = pool.allocate("r", 24), pool.allocate("s", 24)
    assert torch.equal(run.forward([ForwardItem(canvas, alloc, 0, 16, 0, 16)])[0], dense[0, :16])   # prefill
    assert torch.equal(run.forward([ForwardItem(canvas, alloc, 16, 20, 16, 20)])[0], dense[0, 16:20])
    packed = run.forward([ForwardItem(other, alloc2, 0, 24, 20, 24), ForwardItem(canvas, alloc, 16, 20, 16, 20)])
    assert torch.equal(packed[0], dense[1, 20:24]) and torch.equal(packed[1], dense[0, 16:20])
    if not gathered:    # keys only up to the block's end, as the SDAR reference loop has them
        # 20 keys instead of 24 (4 masked): the attention's sums run over another length, which
        # some CPUs' kernels block differently (AMD EPYC: 5.7e-6 apart at a logit scale of 21;
        # Intel: 0), so within 16 float32 ulps of the logits' scale, not bitwise
        step = run.forward([ForwardItem(canvas[:20], alloc, 16, 20, 16, 20)])[0]
        want = dense[0, 16:20]
        torch.testing.assert_close(step, want, rtol=0, atol=16 * torch.finfo(want.dtype).eps * float(want.abs().max()))


def test_earlier_blocks_do_not_see_a_later_block(tiny_sdar):
    """Changing block 4's tokens (positions 16-19) leaves positions 0-15 bit for bit, and
    changes block 4 and the block after it; with full (LLaDA-style) attention, the same change
    moves the earlier positions too."""
    model, args, _ = load_model(tiny_sdar, dtype="float32")
    a = torch.randint(0, args.vocab_size - 1, (24,), generator=torch.Generator().manual_seed(5))
    b = a.clone()
    b[16:20] = (a[16:20] + 1) % args.vocab_size
    blocked = _ours(model, torch.stack([a, b]))
    assert torch.equal(blocked[0, :16], blocked[1, :16])
    for lo, hi in ((16, 20), (20, 24)):
        assert (blocked[0, lo:hi] - blocked[1, lo:hi]).abs().amax(-1).min() > 1e-3
    full = _ours(model, torch.stack([a, b]), block_size=0)
    assert (full[0, :16] - full[1, :16]).abs().amax(-1).min() > 1e-3


def test_config_registration_and_fallbacks(tiny_sdar):
    cfg = read_config(tiny_sdar)
    assert cfg["architectures"] == ["SDARForCausalLM"] and cfg["model_type"] == "sdar"
    assert architecture_of({"model_type": "sdar"}) == "SDARForCausalLM"
    assert head_counts(cfg) == (4, 2)
    qwen3 = {k: cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "intermediate_size")}
    # a config without head_dim, block_size and mask_token_id: Qwen3Config's head_dim 128 and
    # SDAR's released block 4 and <|MASK|> 151669
    a = sdar.args_from_config({**qwen3, "vocab_size": 151936})
    assert (a.head_dim, a.block_size, a.mask_id, a.logit_shift) == (128, 4, 151669, 0)
    a = sdar.args_from_config({**qwen3, "vocab_size": 300, "head_dim": 16, "block_size": 8, "mask_token_id": 7,
                               "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
    assert (a.head_dim, a.block_size, a.mask_id, a.rope_theta) == (16, 8, 7, 5e5)
    with pytest.raises(ValueError, match="rope scaling"):
        sdar.args_from_config({**cfg, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="sliding-window"):
        sdar.args_from_config({**cfg, "use_sliding_window": True})
    gen = json.loads((Path(tiny_sdar) / "generation_config.json").read_text())
    assert gen["eos_token_id"] == cfg["eos_token_id"]


def test_chat_template_round_trip(tiny_sdar):
    cfg = read_config(tiny_sdar)
    tok = Tokenizer(tiny_sdar)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo, 世界"}]
    ids = tok.apply_chat_template(messages)
    text = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhéllo, 世界<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert tok.hf.decode(ids, skip_special_tokens=False) == text
    assert ids[0] == tok.hf.convert_tokens_to_ids("<|im_start|>")          # no BOS, as Qwen3
    assert tok.decode(tok.encode("héllo, 世界")) == "héllo, 世界"
    assert tok.hf.convert_tokens_to_ids("<|MASK|>") == cfg["mask_token_id"]
    assert tok.end_of_turn_ids() == {tok.hf.convert_tokens_to_ids("<|im_end|>"), cfg["eos_token_id"]}


def test_tp2_shards_build_with_replicated_qk_norms(tiny_sdar):
    plain, args, _ = load_model(tiny_sdar, dtype="float32", fuse=False)
    full = plain.state_dict()
    hd, d = args.head_dim, 2
    for r in range(d):
        rank, rargs, _ = load_model(tiny_sdar, dtype="float32", tp=TPShard(r, d, all_reduce=lambda t: None))
        assert (rargs.tp_size, rargs.local_heads, rargs.local_kv_heads) == (2, 2, 1)
        for i, layer in enumerate(rank.model.layers):
            at = layer.self_attn
            assert at.shape == (2, 1, hd)
            pre = f"model.layers.{i}.self_attn."
            q, k, v = (full[pre + f"{x}_proj.weight"] for x in "qkv")
            want = torch.cat([q[r * 2 * hd:(r + 1) * 2 * hd], k[r * hd:(r + 1) * hd], v[r * hd:(r + 1) * hd]])
            assert torch.equal(at.qkv.weight_t.t(), want)
            assert torch.equal(at.o_proj.weight_t.t(), full[pre + "o_proj.weight"][:, r * 2 * hd:(r + 1) * 2 * hd])
            for norm in ("q_norm", "k_norm"):
                assert torch.equal(getattr(at, norm).weight, full[pre + f"{norm}.weight"])


def test_tp2_packed_forward_equals_tp1(tiny_sdar):
    """tests/model/test_tp_forward.py's two processes over gloo, on the block-causal model: the
    block mask and the per-head q/k norms on each rank's heads; float32 within 1e-5 (two
    partial sums and one add per row-split projection)."""
    got = run_ranks(tiny_sdar, ["float32"])
    runner, pool, args = build(tiny_sdar, "float32", None)
    assert got["follower-1-float32"] == 2
    for w, g in zip(packed_forwards(runner, pool, args), map(torch.from_numpy, got["float32"])):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
