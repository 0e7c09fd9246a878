"""Serving fuses Q/K/V and gate/up into single matmuls over contiguous transposed weights
(model/layers.py ServingLinear). Same logits as the checkpoint-shaped model, bit for bit, through
the dense and the paged path; rows that do not depend on the call's row count."""
import pytest
import torch

from dllm_server.model.attention import DenseBatch
from dllm_server.model.layers import ServingLinear
from dllm_server.model.loader import load_model
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


def test_serving_linear_rows_do_not_depend_on_the_row_count():
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(64, 96, bias=True)
    torch.nn.init.normal_(lin.weight, generator=g)
    x = torch.randn(256, 64, generator=g)
    fused = ServingLinear(lin)
    with torch.inference_mode():
        ref = fused(x)
        torch.testing.assert_close(ref, lin(x), rtol=1e-5, atol=1e-4)
        for rows in (2, 4, 8, 9, 16, 32, 33, 64):
            assert torch.equal(fused(x[:rows]), ref[:rows]), rows
