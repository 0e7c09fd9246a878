"""Right after a boundary refresh, a cached block forward equals the full forward's block slice."""
import pytest
import torch

from dllm_server.model.loader import load_model
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner, fed_range

from .oracles import full_logits


@pytest.mark.parametrize("mode", ["dual", "prefix"])
@pytest.mark.parametrize("page_size", [16, 4])
def test_cached_block_logits_match_full_forward(tiny_model, mode, page_size):
    model, args, dtype = load_model(tiny_model, dtype="float32")
    pool = KVPool(args.num_layers, 64, page_size, args.num_kv_heads, args.head_dim, dtype)
    runner = ModelRunner(model, args, pool, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    prompt_len, block, answer = 13, 8, 32
    canvas = torch.full((prompt_len + answer,), args.mask_id, dtype=torch.int64)
    canvas[:prompt_len] = torch.randint(0, 256, (prompt_len,), generator=g)
    canvas[prompt_len: prompt_len + 8] = torch.randint(0, 256, (8,), generator=g)   # block 0 decided
    canvas[prompt_len + 9] = 7                                                       # one commit in block 1
    if page_size == 4:   # fragment the pool so this canvas gets non-contiguous pages
        pool.allocate("a", 8), pool.allocate("b", 8), pool.free("a")
    alloc = pool.allocate("r", canvas.numel())
    s, e = prompt_len + block, prompt_len + 2 * block
    runner.forward([ForwardItem(canvas, alloc, 0, canvas.numel(), s, e)])             # boundary refresh
    a, b = fed_range(mode, False, s, e, canvas.numel(), args.logit_shift)
    cached = runner.forward([ForwardItem(canvas, alloc, a, b, s, e)])[0].double()
    expected = full_logits(model, canvas)[s:e]
    torch.testing.assert_close(cached, expected, rtol=1e-4, atol=1e-4)
