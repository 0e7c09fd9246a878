"""Where a checkpoint folder is and what its config.json says, without loading any weights (the
front process reads these; the workers load the model). The embedded demo model is a small
LLaDA-architecture checkpoint shipped in the package (assets/demo-model, trained by
scripts/train_tiny.py; see its MODEL_CARD.md); if the package was installed without it, a seeded
random tiny checkpoint is written to the user cache once."""
from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)
ASSET = Path(__file__).resolve().parent / "assets" / "demo-model"
FALLBACK = Path.home() / ".cache" / "dllm-server" / "tiny-llada"


def model_path(model: str | None) -> Path:
    """The folder to serve: the one named, else the embedded demo model."""
    return Path(model) if model is not None else embedded_model_path()


def embedded_model_path() -> Path:
    if (ASSET / "config.json").is_file():
        return ASSET
    if not (FALLBACK / "config.json").is_file():
        from .model.tiny import make_tiny_model     # only when the package lost its asset
        log.warning("embedded demo model missing; writing a random tiny checkpoint to %s", FALLBACK)
        make_tiny_model(FALLBACK, arch="llada", seed=0)
    return FALLBACK


def read_config(path: str | Path) -> dict:
    folder = Path(path)
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"model: {folder} has no config.json (expected a Hugging Face checkpoint folder)")
    return json.loads(cfg_file.read_text())
