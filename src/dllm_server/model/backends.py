"""Attention backend selection: SDPA everywhere, FlashInfer on CUDA when installed (a module of
its own so attention.py, which the FlashInfer backend builds on, does not import it back)."""
from __future__ import annotations

import logging

import torch

from .attention import AttentionFn, sdpa_attention

log = logging.getLogger(__name__)


def select_backend(name: str, device: torch.device, **shape) -> AttentionFn:
    """`sdpa` (everywhere) or `flashinfer` (CUDA with flashinfer installed; opt-in until it has
    been validated on a GPU, issue 8). Without CUDA or without the package, flashinfer falls
    back to SDPA with a warning, so one configuration runs everywhere."""
    if name == "sdpa":
        return sdpa_attention
    if name != "flashinfer":
        raise ValueError(f"attention_backend: unknown backend {name!r}")
    if device.type != "cuda":
        log.warning("attention_backend flashinfer needs a CUDA device; using SDPA on %s", device)
        return sdpa_attention
    try:
        from .flashinfer_backend import FlashInferAttention    # imports flashinfer itself lazily
        return FlashInferAttention(device, **shape)
    except ImportError as exc:
        log.warning("attention_backend flashinfer: %s; using SDPA (pip install flashinfer-python)", exc)
        return sdpa_attention
