"""Would fusing the elementwise passes pay on this CPU? RMSNorm, rotary and SwiGLU at a loaded demo-model
v1 iteration's shape, eager against torch.compile (inductor's C++ backend; needs a C++ compiler).

    python -m bench.compile_elementwise [--json out.json]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.harness import Report, Timer, parser, samples_s

# 912 tokens, d=256, 4 heads x 64, MLP 704: a loaded iteration of the demo model v1
T, D_MODEL, MLP, HEADS, HEAD_DIM = 912, 256, 704, 4, 64


def best_us(fn, arg, reps: int = 20, draws: int = 7) -> float:
    """The best of `draws` means over `reps` calls, in microseconds."""
    return 1e6 * min(samples_s(lambda: fn(arg), draws, warmup=3, inner=reps))


def main() -> None:
    a = parser(__doc__, json_out=True).parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(T, D_MODEL, generator=g), torch.rand(D_MODEL, generator=g)
    gu = torch.randn(T, 2 * MLP, generator=g)
    qk = torch.randn(T, 2 * HEADS, HEAD_DIM, generator=g)
    cos, sin = torch.randn(T, 1, HEAD_DIM, generator=g), torch.randn(T, 1, HEAD_DIM, generator=g)
    half = HEAD_DIM // 2

    def norm(a):
        return F.rms_norm(a, (D_MODEL,), w, eps=1e-5)

    def swiglu(a):
        gate, up = a.chunk(2, -1)
        return F.silu(gate).mul_(up)

    def swiglu_pure(a):      # the out-of-place form for the compiler
        gate, up = a.chunk(2, -1)
        return F.silu(gate) * up

    def rotary(a):
        return torch.cat([a[..., half:], a[..., :half]], dim=-1).mul_(sin).add_(a * cos)

    def rotary_pure(a):
        return torch.cat([a[..., half:], a[..., :half]], dim=-1) * sin + a * cos

    print(f"torch {torch.__version__}, 1 thread, {T} tokens\n")
    report = Report(a.json)
    table = report.table(["pass", ("eager (us)", ".0f"), ("compiled (us)", ".0f"), ("compiled / eager", ".2f"),
                          "bit-identical", ("compile (s)", ".1f")])
    for name, eager, pure, arg in (("RMSNorm", norm, norm, x), ("rotary (Q and K)", rotary, rotary_pure, qk),
                                   ("SwiGLU product", swiglu, swiglu_pure, gu)):
        with Timer() as compile_s:
            comp = torch.compile(pure, dynamic=True)
            same = torch.equal(comp(arg), eager(arg))
        e, c = best_us(eager, arg), best_us(comp, arg)
        table.row(name, e, c, c / e, same, compile_s.s)
    report.save()


if __name__ == "__main__":
    main()
