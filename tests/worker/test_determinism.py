"""The batch-invariance self-check (worker/determinism.py) on kernels whose verdict is known: a
fake matmul that changes its summation order with the row count (what MKL, oneDNN or cuBLAS may
do when they pick a blocking by shape) is caught at exactly the counts where it switches, and
fixed-row matmuls pass on it; a real tiny model's check names its shapes and row counts."""
import torch
from torch import nn

from dllm_server.model.layers import ServingLinear
from dllm_server.model.loader import load_model
from dllm_server.worker import determinism as D


def split_k_when_tall(w_t: torch.Tensor, switch_rows: int):
    """x @ w_t one row at a time (so each row's bits are its own, on any CPU), but with K summed in
    two halves from `switch_rows` rows up."""
    half = w_t.shape[0] // 2
    rows = lambda x, w: torch.cat([x[i:i + 1] @ w for i in range(x.shape[0])])

    def mm(x):
        if x.shape[0] < switch_rows:
            return rows(x, w_t)
        return rows(x[:, :half].contiguous(), w_t[:half]) + rows(x[:, half:].contiguous(), w_t[half:])
    return mm


class SplitKLinear(ServingLinear):
    """A projection running on that fake kernel: the device a test cannot have."""

    def __init__(self, lin: nn.Linear, switch_rows: int):
        super().__init__(lin)
        self.kernel = split_k_when_tall(self.weight_t.detach(), switch_rows)

    def matmul(self, x):
        if self.fixed_rows and x.shape[0] != self.fixed_rows:
            return self._fixed(x)
        return self.kernel(x) + self.bias

    def _fixed(self, x):
        c, n = self.fixed_rows, x.shape[0]
        x = torch.cat([x, x.new_zeros(-n % c, x.shape[1])])
        return torch.cat([self.kernel(x[i:i + c]) for i in range(0, x.shape[0], c)])[:n] + self.bias


def test_a_kernel_that_switches_with_the_row_count_is_caught_where_it_switches():
    g = torch.Generator().manual_seed(0)
    w_t, x = torch.randn(256, 64, generator=g), torch.randn(128, 256, generator=g)
    counts = [1, 2, 8, 15, 16, 17, 32, 64, 100, 127]
    # the full call (128 rows) splits K; calls under 16 rows do not, and differ in their last bits
    assert D.check_rows(split_k_when_tall(w_t, 16), x, counts) == [1, 2, 8, 15]
    assert D.check_rows(split_k_when_tall(w_t, 1000), x, counts) == []      # never switches: invariant


def test_check_model_reports_failures_and_fixed_rows_cure_them():
    torch.manual_seed(0)
    model = nn.Sequential(SplitKLinear(nn.Linear(256, 96), switch_rows=40),
                          SplitKLinear(nn.Linear(96, 256), switch_rows=10 ** 6))     # never switches
    r = D.check_model(model, block_len=8, max_active_decodes=8)
    assert not r.holds and r.num_failures >= 1 and all(f.startswith("256->96") for f in r.failures)
    assert r.failures[0] == "256->96: 1 of 65 rows"
    assert set(r.shapes) == {(256, 96), (96, 256)} and 8 in r.row_counts and 64 in r.row_counts
    assert "does NOT hold" in D.summary(r) and "--fixed-matmul-rows" in D.summary(r)
    D.set_fixed_rows(model, 8)
    fixed = D.check_model(model, block_len=8, max_active_decodes=8)
    assert fixed.holds and fixed.fixed_rows == 8 and "holds" in D.summary(fixed)


def test_row_counts_cover_block_steps_and_odd_prefill_lengths():
    counts = D.row_counts(block_len=32, max_active_decodes=4, max_rows=200)
    assert {32, 64, 96, 128} <= set(counts) and {1, 2, 17, 33, 127} <= set(counts)
    assert max(counts) < 200 and counts == sorted(set(counts))


def test_a_real_tiny_model_is_checked_on_its_own_shapes(tiny_llada):
    model, args, _ = load_model(tiny_llada, dtype="float32")
    r = D.check_model(model, block_len=8, max_active_decodes=4)
    h = args.hidden
    assert (h, (args.num_heads + 2 * args.num_kv_heads) * args.head_dim) in r.shapes   # fused QKV
    assert (args.mlp_hidden, h) in r.shapes and r.seconds < 5
    D.set_fixed_rows(model, 16)
    assert D.check_model(model, block_len=8, max_active_decodes=4).holds
