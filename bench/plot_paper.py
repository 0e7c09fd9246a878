"""Plots of a bench/paper.py run from its printed output: mean and p99 latency against the token budget
per mix, and per placement (docs/img/paper_tau_sweep.png, docs/img/paper_placements.png).

    python -m bench.paper ... --only B,C,D > docs/results/paper_bcd.txt
    python -m bench.plot_paper [docs/results/paper_bcd.txt]
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

from bench.harness import parser

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def tables(text: str) -> list[list[list[str]]]:
    """Every markdown table in the output, in order (header row first, separator dropped)."""
    out, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif not line.startswith("|---") and rows:
            out.append(rows)
            rows = []
    return out


def main(path: str) -> None:
    # paper.py --only B,C,D prints: B decode-heavy, B prefill-heavy, C decode-heavy, C prefill-heavy, D profile.
    found = tables(Path(path).read_text())
    mixes = ("decode-heavy", "prefill-heavy")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, mix, table in zip(axes, mixes, found[0:2]):
        rows = table[1:]
        taus = [r[0] for r in rows]
        ax.plot(taus, [float(r[2]) for r in rows], "o-", label="mean")
        ax.plot(taus, [float(r[4]) for r in rows], "s--", label="p99")
        ax.set_title(f"{mix}: e2e latency vs token budget")
        ax.set_xlabel("tau")
        ax.set_ylabel("seconds")
        ax.legend()
    fig.tight_layout()
    fig.savefig("docs/img/paper_tau_sweep.png", dpi=110)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, mix, table in zip(axes, mixes, found[2:4]):
        rows = table[1:]
        x = list(range(len(rows)))
        ax.bar([i - 0.2 for i in x], [float(r[2]) for r in rows], 0.4, label="mean")
        ax.bar([i + 0.2 for i in x], [float(r[4]) for r in rows], 0.4, label="p99")
        ax.set_xticks(x, [r[0] for r in rows], fontsize=8)
        ax.set_title(f"{mix}: e2e latency by placement (2 workers)")
        ax.set_ylabel("seconds")
        ax.legend()
    fig.tight_layout()
    fig.savefig("docs/img/paper_placements.png", dpi=110)
    print("docs/img/paper_tau_sweep.png docs/img/paper_placements.png")


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("output", nargs="?", default="docs/results/paper_bcd.txt", help="a bench.paper run's output")
    main(ap.parse_args().output)
