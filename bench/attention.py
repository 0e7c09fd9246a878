"""Attention for one layer of a loaded decode iteration, by backend form: paged per-sequence SDPA
(the CPU's), padded (gather + one SDPA, the CUDA-graph form) and one SDPA over unpaged keys (a bound).

    python -m bench.attention [--batch 1 16 32] [--q-len 32] [--kv-len 224] [--threads 1] [--json out.json]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.harness import Report, median_time_s, parser, result
from dllm_server.model.attention import AttentionBatch, LayerKV, PaddedBatch, SeqSpan, padded_attention, sdpa_attention


def timed(fn, reps: int) -> float:
    return median_time_s(fn, reps, warmup=3)


def main() -> None:
    ap = parser(__doc__, threads=1, json_out=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 32])
    ap.add_argument("--q-len", type=int, default=32)
    ap.add_argument("--kv-len", type=int, default=224)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    h, d, w, n = a.heads, a.head_dim, a.q_len, a.kv_len
    print(f"one layer, {h} heads x {d}, {w} queries over {n} keys per sequence, {a.threads} thread(s), "
          f"median of {a.reps}; torch {torch.__version__}\n")
    report = Report(a.json)
    table = report.table(["batch", ("per-sequence SDPA (ms)", ".3f"), ("padded: gather + one SDPA (ms)", ".3f"),
                          ("one SDPA, no gather (bound, ms)", ".3f")])
    rows = {}
    g = torch.Generator().manual_seed(0)
    for b in a.batch:
        slots = (b * n + 1) * 1
        kv = LayerKV(torch.randn(slots, h, d, generator=g), torch.randn(slots, h, d, generator=g))
        q = torch.randn(b * w, h, d, generator=g)
        k, v = torch.randn(b * w, h, d, generator=g), torch.randn(b * w, h, d, generator=g)
        fed = torch.cat([torch.arange(i * n + n - w, i * n + n) for i in range(b)])
        seqs = [SeqSpan(i * w, w, n - w, n, i * n, None) for i in range(b)]
        paged = AttentionBatch(seqs, fed_slots=fed)
        padded = PaddedBatch(b, w, fed, torch.arange(b * n).view(b, n), torch.ones(b, n, dtype=torch.bool))

        def bound():
            kv.k.index_copy_(0, fed, k)
            kv.v.index_copy_(0, fed, v)
            keys = kv.k[: b * n].view(b, n, h, d).transpose(1, 2)
            vals = kv.v[: b * n].view(b, n, h, d).transpose(1, 2)
            o = F.scaled_dot_product_attention(q.view(b, w, h, d).transpose(1, 2), keys, vals)
            return o.transpose(1, 2).reshape(q.shape)

        ref = sdpa_attention(q, k, v, kv, paged).reshape(q.shape)
        for other in (padded_attention(q, k, v, kv, padded), bound()):
            torch.testing.assert_close(other, ref, rtol=1e-5, atol=1e-5)
        t = [timed(lambda: sdpa_attention(q, k, v, kv, paged), a.reps),
             timed(lambda: padded_attention(q, k, v, kv, padded), a.reps), timed(bound, a.reps)]
        table.row(b, 1e3 * t[0], 1e3 * t[1], 1e3 * t[2])
        rows.update({f"b{b}_per_sequence_ms": 1e3 * t[0], f"b{b}_padded_ms": 1e3 * t[1], f"b{b}_bound_ms": 1e3 * t[2]})
    report.save()
    result(rows)


if __name__ == "__main__":
    main()
