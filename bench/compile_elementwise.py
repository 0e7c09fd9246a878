"""Would fusing the elementwise passes pay on this CPU? RMSNorm, rotary and SwiGLU at a loaded
demo-model v1 iteration's shape (912 tokens, d=256, 4 heads x 64, MLP 704), eager as the served
model runs them (model/layers.py) against torch.compile (inductor's C++ backend, dynamic
shapes), with the compile time and whether the results are bit-identical. Needs a C++ compiler.

    python bench/compile_elementwise.py
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

T, D_MODEL, MLP, HEADS, HEAD_DIM = 912, 256, 704, 4, 64


def best_us(fn, arg, reps: int = 20, draws: int = 7) -> float:
    for _ in range(3):
        fn(arg)
    best = float("inf")
    for _ in range(draws):
        t = time.perf_counter()
        for _ in range(reps):
            fn(arg)
        best = min(best, (time.perf_counter() - t) / reps)
    return best * 1e6


def main() -> None:
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
    print("| pass | eager (us) | compiled (us) | compiled / eager | bit-identical | compile (s) |\n|---|---|---|---|---|---|")
    for name, eager, pure, arg in (("RMSNorm", norm, norm, x), ("rotary (Q and K)", rotary, rotary_pure, qk),
                                   ("SwiGLU product", swiglu, swiglu_pure, gu)):
        t0 = time.perf_counter()
        comp = torch.compile(pure, dynamic=True)
        same = torch.equal(comp(arg), eager(arg))
        compile_s = time.perf_counter() - t0
        e, c = best_us(eager, arg), best_us(comp, arg)
        print(f"| {name} | {e:.0f} | {c:.0f} | {c / e:.2f} | {same} | {compile_s:.1f} |", flush=True)


if __name__ == "__main__":
    main()
