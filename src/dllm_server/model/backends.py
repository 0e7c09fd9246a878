"""Attention backend choice, apart from attention.py so that flashinfer_backend.py can build on attention.py."""
from __future__ import annotations

import logging

import torch

from .attention import AttentionFn, sdpa_attention

log = logging.getLogger(__name__)


def select_backend(name: str, device: torch.device, **shape) -> AttentionFn:
    """`sdpa`, or `flashinfer` on CUDA with the package installed; otherwise SDPA with a warning."""
    if name == "sdpa":
        return sdpa_attention
    if name != "flashinfer":
        raise ValueError(f"attention_backend: unknown backend {name!r}")
    if device.type != "cuda":
        log.warning("attention_backend flashinfer needs a CUDA device; using SDPA on %s", device)
        return sdpa_attention
    try:
        from .flashinfer_backend import FlashInferAttention
        return FlashInferAttention(device, **shape)
    except ImportError as exc:
        log.warning("attention_backend flashinfer: %s; using SDPA (pip install flashinfer-python)", exc)
        return sdpa_attention
