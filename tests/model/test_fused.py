"""Serving fuses Q/K/V and gate/up into single matmuls over contiguous transposed weights
(model/layers.py ServingLinear). Same logits as the checkpoint-shaped model, bit for bit, through
the dense and the paged path; rows that do not depend on the call's row count where this CPU's
matmul allows it, and always with fixed_rows."""
import pytest
import torch

from dllm_server.model.attention import DenseBatch
from dllm_server.model.layers import ServingLinear
from dllm_server.model.loader import load_model
from dllm_server.worker.determinism import check_rows
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner


def _paged_logits(model, args, canvas, s, e):
    pool = KVPool(args.num_layers, 32, 4, args.num_kv_heads, args.head_dim, torch.float32)
    runner = ModelRunner(model, args, pool, torch.device("cpu"))
    alloc = pool.allocate("r", canvas.numel())
    full = runner.forward([ForwardItem(canvas, alloc, 0, canvas.numel(), s, e)])
    step = runner.forward([ForwardItem(canvas, alloc, s, e, s, e)])        # a dual-cache block step
    return full, step


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_fused_model_equals_the_checkpoint_shaped_one(request, arch):
    path = request.getfixturevalue(f"tiny_{arch}")
    plain, args, _ = load_model(path, dtype="float32", fuse=False)
    fused, _, _ = load_model(path, dtype="float32")
    assert any(isinstance(m, ServingLinear) for m in fused.modules())
    assert not any(isinstance(m, ServingLinear) for m in plain.modules())
    assert any(k.endswith("q_proj.weight") for k in plain.state_dict())       # the HF names
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab_size, (3 * 40,), generator=g)
    pos = torch.arange(40).repeat(3)
    with torch.inference_mode():
        a = plain(ids, pos, DenseBatch(3), None, torch.arange(120))[:, : args.vocab_size]
        b = fused(ids, pos, DenseBatch(3), None, torch.arange(120))
    assert b.shape[-1] == args.vocab_size                  # the head drops its padding rows
    assert torch.equal(a, b)
    canvas = ids[:40].clone()
    canvas[24:] = args.mask_id
    for x, y in zip(_paged_logits(plain, args, canvas, 24, 32), _paged_logits(fused, args, canvas, 24, 32)):
        assert torch.equal(x, y)


ROW_COUNTS = (2, 4, 8, 9, 16, 32, 33, 64, 100, 255)


def _linear(seed: int = 1) -> tuple[torch.nn.Linear, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(64, 96, bias=True)
    torch.nn.init.normal_(lin.weight, generator=g)
    return lin, torch.randn(256, 64, generator=g)


def test_serving_linear_rows_are_as_batch_invariant_as_this_cpus_matmul():
    """ServingLinear adds nothing that depends on the row count: at every row count where this
    CPU's own matmul (torch.addmm over the same transposed weight) is row-invariant for the shape,
    so is the projection (checked on any CPU); where the kernel is not, the property cannot hold
    there, and if it holds at no row count the test says so and skips."""
    lin, x = _linear()
    fused = ServingLinear(lin)
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), lin(x), rtol=1e-5, atol=1e-4)
        w_t, b = lin.weight.detach().t().contiguous(), lin.bias.detach()
        kernel = check_rows(lambda a: torch.addmm(b, a, w_t), x, ROW_COUNTS)
        ours = check_rows(fused, x, ROW_COUNTS)
    assert set(ours) <= set(kernel), f"row counts where the kernel is invariant and ServingLinear is not: " \
                                     f"{sorted(set(ours) - set(kernel))}"
    if set(kernel) == set(ROW_COUNTS):
        pytest.skip(f"this CPU's addmm is row-invariant for 64->96 at no row count tried ({ROW_COUNTS} of "
                    "256 rows): nothing to compare; the self-check reports it (worker/determinism.py), "
                    "fixed_rows forces it")


@pytest.mark.parametrize("fixed", [8, 16])
def test_fixed_rows_make_every_row_count_invariant_on_any_kernel(fixed):
    """fixed_rows runs every call as matmuls of exactly `fixed` rows (the last zero-padded), so a
    row's bits never depend on the call's row count, whatever the kernel does with row counts;
    and the values stay the projection's."""
    lin, x = _linear(2)
    fused = ServingLinear(lin)
    fused.fixed_rows = fixed
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), lin(x), rtol=1e-5, atol=1e-4)
        assert check_rows(fused, x, tuple(range(1, 70)) + ROW_COUNTS) == []
