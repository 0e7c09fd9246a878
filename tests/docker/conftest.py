"""Prints what the podman image test measured (build, size, start, stop) at the end of the run."""
from __future__ import annotations

from .podmanctx import METRICS


def pytest_terminal_summary(terminalreporter):
    if METRICS:
        terminalreporter.write_line("CPU image (podman): " + ", ".join(f"{k} {v}" for k, v in METRICS.items()))
