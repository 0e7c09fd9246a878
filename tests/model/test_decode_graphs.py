"""The fixed-shape decode path (what CUDA graphs replay) equals the paged SDPA path: same block
logits, same KV written, nothing outside the fed slots touched; and whole generations with it are
token-identical. On the CPU it runs eagerly from the same buffers a graph would replay."""
import pytest
import torch

from dllm_server import LLM, SamplingParams
from dllm_server.model.loader import load_model
from dllm_server.worker.cuda_graph import MIN_KEYS, DecodeGraphs, capture_plan, pow2_at_least
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner, fed_range, window_lead


def _setup(path, page_size=4, num_pages=200):
    model, args, dtype = load_model(path, "float32", torch.device("cpu"))
    pool = KVPool(args.num_layers, num_pages, page_size, args.num_kv_heads, args.head_dim, dtype)
    return model, args, pool


def _fragment(pool):
    """Every other page taken, so later allocations get gathered (non-contiguous) pages."""
    for p in range(0, pool.num_pages, 2):
        pool.allocate(f"hole{p}", pool.page_size)
        pool.allocate(f"keep{p}", pool.page_size)
    for p in range(0, pool.num_pages, 2):
        pool.free(f"hole{p}")


def test_pow2_buckets():
    assert [pow2_at_least(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]
    assert pow2_at_least(3, 256) == 256 and pow2_at_least(300, 256) == 512


@pytest.mark.parametrize("decoding", ["fast_dllm", "shifted"])
def test_fixed_shape_step_equals_paged_sdpa(tiny_model, decoding):
    model, args, pool = _setup(tiny_model)
    _fragment(pool)
    lead = window_lead(args.logit_shift, decoding)
    eager = ModelRunner(model, args, pool, torch.device("cpu"))
    fixed = ModelRunner(model, args, pool, torch.device("cpu"),
                        decode_graphs=DecodeGraphs(model, args, pool, torch.device("cpu"), 64, capture=False,
                                                   lead=lead))
    g = torch.Generator().manual_seed(0)
    items = []
    for b, (prompt, answer) in enumerate([(5, 16), (13, 24), (40, 8), (3, 32), (21, 16)]):   # 5: padded to 8
        n = prompt + answer
        canvas = torch.randint(0, 200, (n,), generator=g)
        canvas[prompt:] = args.mask_id
        canvas[prompt + 1] = 7                          # one committed token in the block
        alloc = pool.allocate(f"r{b}", n)
        start = prompt
        eager.forward([ForwardItem(canvas, alloc, 0, n, start, start + 8)])        # prefill fills the cache
        a, e = fed_range("dual", False, start, start + 8, n, lead)
        items.append(ForwardItem(canvas, alloc, a, e, start, start + 8))
    assert any(it.alloc.slot_ids is not None for it in items)
    assert fixed.graphs.fits(items)
    before = [layer.k.clone() for layer in pool.layers]
    want = eager.forward(items, decode_only=True)
    after_eager = [layer.k.clone() for layer in pool.layers]
    for layer, k in zip(pool.layers, before):
        layer.k.copy_(k)
    got = fixed.forward(items, decode_only=True)
    assert got.shape == want.shape == (5, 8, args.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    scratch = slice(pool.scratch_page * pool.page_size, None)
    for layer, k in zip(pool.layers, after_eager):      # same KV written, nowhere else touched
        torch.testing.assert_close(layer.k[: scratch.start], k[: scratch.start], rtol=1e-5, atol=1e-5)
    assert list(fixed.graphs.shapes) == [(8, 8 + lead, 256)]


def test_prefill_or_mixed_widths_stay_on_the_paged_path(tiny_llada):
    model, args, pool = _setup(tiny_llada)
    graphs = DecodeGraphs(model, args, pool, torch.device("cpu"), 4, capture=False)
    c = torch.full((24,), args.mask_id)
    a = pool.allocate("a", 24)
    decode = ForwardItem(c, a, 8, 16, 8, 16)
    assert graphs.fits([decode])
    assert not graphs.fits([ForwardItem(c, a, 0, 24, 8, 16)])                  # a prefill
    assert not graphs.fits([decode, ForwardItem(c, a, 8, 12, 8, 12)])          # another block width
    assert not graphs.fits([decode] * 5)                                        # past max_batch


def test_generations_identical_with_fixed_shape_decodes(tiny_model):
    reqs = [({"prompt_token_ids": [i + 1, 9, 4, 2 * i + 3]}, SamplingParams(max_tokens=24 + 8 * (i % 3), seed=i,
                                                                           temperature=0.7 * (i % 2)))
            for i in range(12)]
    plain = LLM(tiny_model, block_length=8, dtype="float32")
    fixed = LLM(tiny_model, block_length=8, dtype="float32")
    runner = fixed.runner
    runner.graphs = DecodeGraphs(runner.model, fixed.args, runner.pool, torch.device("cpu"), 64, capture=False,
                                 lead=fixed.core.stepper.lead)
    want = plain.generate([p for p, _ in reqs], [s for _, s in reqs])
    got = fixed.generate([p for p, _ in reqs], [s for _, s in reqs])
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert runner.graphs.shapes, "no iteration took the fixed-shape path"


def test_capture_all_covers_every_bucket_of_the_default_width(tiny_llada):
    """Start-up capture (what a CUDA worker does; here without the capture itself): every batch
    and key bucket of the default block width exists, so serving never builds one."""
    model, args, pool = _setup(tiny_llada)
    graphs = DecodeGraphs(model, args, pool, torch.device("cpu"), 4, capture=False)
    assert graphs.capture_all(8) == 3 * 3                    # batches 1, 2, 4 x keys 256, 512, 1024
    assert {k for _, _, k in graphs.shapes} == {256, 512, 1024} and args.max_len == 1024
    runner = ModelRunner(model, args, pool, torch.device("cpu"), decode_graphs=graphs)
    c = torch.full((40,), args.mask_id)
    allocs = [pool.allocate(f"r{i}", 40) for i in range(3)]
    runner.forward([ForwardItem(c, a, 8, 16, 8, 16) for a in allocs], decode_only=True)
    assert len(graphs.shapes) == 9


def test_capture_plan_is_exactly_the_reachable_buckets():
    """Brute force over every batch size and longest canvas: a bucket is planned iff some batch
    that fits the pool (longest canvas's pages + one page per other sequence) lands in it."""
    for max_len, max_batch, num_pages, page in [(1024, 4, 200, 4), (2048, 8, 40, 16), (4096, 64, 70, 16),
                                                 (300, 5, 3, 128), (8192, 16, 1000, 16)]:
        reachable = {(pow2_at_least(n), pow2_at_least(longest, MIN_KEYS))
                     for n in range(1, max_batch + 1) for longest in range(1, max_len + 1)
                     if -(-longest // page) + n - 1 <= num_pages}
        plan = capture_plan(max_len, max_batch, num_pages, page)
        assert set(plan) == reachable and len(plan) == len(reachable), (max_len, max_batch, num_pages, page)
        assert plan == sorted(plan, key=lambda bk: (-bk[1], -bk[0]))           # largest first


def test_capture_plan_caps_keys_at_the_pool_not_the_model():
    """Dream's 131072 positions with the default 65536-token pool: keys stop at 65536, not 131072;
    LLaDA's 4096 with the same pool: the 35 shapes of the default width."""
    dream = capture_plan(131072, 64, 4096, 16)
    assert max(k for _, k in dream) == 65536 and len(dream) == 9 * 7
    assert len(capture_plan(4096, 64, 4096, 16)) == 5 * 7
    small = capture_plan(4096, 64, 30, 16)     # 480 tokens: keys <= 512, and no batch of 33 sequences
    assert max(k for _, k in small) == 512 and (64, 256) not in small and (32, 256) in small
    assert (16, 512) in small and (32, 512) not in small   # 17 pages of the longest + 16 others > 30


def test_all_shapes_of_a_width_share_one_output_buffer(tiny_llada):
    """One float32 logits buffer per block width, not one per graph; results still match eager."""
    model, args, pool = _setup(tiny_llada)
    graphs = DecodeGraphs(model, args, pool, torch.device("cpu"), 4, capture=False)
    graphs.capture_all(8)
    assert list(graphs.outputs) == [8] and graphs.outputs[8].shape == (4 * 8, args.vocab_size)
    eager = ModelRunner(model, args, pool, torch.device("cpu"))
    fixed = ModelRunner(model, args, pool, torch.device("cpu"), decode_graphs=graphs)
    c = torch.full((120,), args.mask_id)
    c[:40] = torch.arange(1, 41)
    allocs = [pool.allocate(f"r{i}", 120) for i in range(3)]
    eager.forward([ForwardItem(c, a, 0, 120, 40, 48) for a in allocs])
    base = graphs.outputs[8].untyped_storage().data_ptr()
    for n in (1, 3):                                       # shapes (1, 256) and (4, 256)
        items = [ForwardItem(c, a, 40, 48, 40, 48) for a in allocs[:n]]
        want = eager.forward(items)
        got = fixed.forward(items, decode_only=True)
        assert got.untyped_storage().data_ptr() == base
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(graphs.outputs) == 1
