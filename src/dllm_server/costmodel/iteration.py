"""What one worker iteration fed: the record every cost model prices."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class IterationStats:
    prefill_tokens: int = 0
    decode_tokens: int = 0
    decode_keys: int = 0
    prefill_sq: int = 0
    num_prefills: int = 0
    num_decodes: int = 0
    deficit_tokens: int = 0
    forward_s: float = 0.0
