"""The scheduler's monotonic counters since start, exported by /metrics as totals."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Counters:
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0
    kv_transfers_failed: int = 0
    kv_handoffs: int = 0
    kv_handoff_stall_seconds: float = 0.0   # PrefillDone -> first decode step on the decode worker
    prefills_overflowed: int = 0
    blocks_continued: int = 0
    worker_restarts: int = 0
    worker_hangs: int = 0
    streams_overflowed: int = 0             # requests ended because their consumer stopped reading
    canvas_positions: int = 0
    blocks_evicted: int = 0                 # taken back from a draining instance before they started
    reconfigurations: int = 0
    drain_seconds: float = 0.0
    requests_resumed: int = 0               # requests whose worker died, redone from their block's start elsewhere
    requests_yielded: int = 0               # deadline scheduling: requests moved back once late (ordering.py)
