"""The embedded demo model: a small LLaDA-architecture checkpoint shipped in the package
(assets/demo-model, trained by scripts/train_tiny.py; see its MODEL_CARD.md). If the package
was installed without it, a seeded random tiny checkpoint is written to the user cache once."""
from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)
ASSET = Path(__file__).resolve().parent.parent / "assets" / "demo-model"
FALLBACK = Path.home() / ".cache" / "dllm-server" / "tiny-llada"


def model_path(model: str | None) -> Path:
    """The folder to serve: the one named, else the embedded demo model."""
    return Path(model) if model is not None else embedded_model_path()


def embedded_model_path() -> Path:
    if (ASSET / "config.json").is_file():
        return ASSET
    if not (FALLBACK / "config.json").is_file():
        from .tiny import make_tiny_model
        log.warning("embedded demo model missing; writing a random tiny checkpoint to %s", FALLBACK)
        make_tiny_model(FALLBACK, arch="llada", seed=0)
    return FALLBACK
