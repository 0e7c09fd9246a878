"""Where a checkpoint folder is and what its config.json and generation_config.json say, without loading weights.
The embedded demo model (assets/demo-model, see its MODEL_CARD.md) is never replaced by random weights."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from . import hub

log = logging.getLogger(__name__)
ASSET = Path(__file__).resolve().parent / "assets" / "demo-model"


ARCHITECTURES = ("LLaDAModelLM", "DreamModel", "SDARForCausalLM", "LLaDA2MoeModelLM")
MODEL_TYPES = {"llada": "LLaDAModelLM", "dream": "DreamModel", "sdar": "SDARForCausalLM",
               "llada2": "LLaDA2MoeModelLM", "llada2_moe": "LLaDA2MoeModelLM"}
GENERATION_DEFAULTS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                       "max_new_tokens": "max_tokens"}


def bytes_to_unicode() -> dict[int, str]:
    """The byte -> printable-character map of byte-level BPE (printable bytes map to themselves)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


HEAD_KEYS = {"LLaDAModelLM": ("n_heads", "n_kv_heads"), "DreamModel": ("num_attention_heads", "num_key_value_heads"),
             "SDARForCausalLM": ("num_attention_heads", "num_key_value_heads"),
             "LLaDA2MoeModelLM": ("num_attention_heads", "num_key_value_heads")}


def head_counts(cfg: dict, where: str = "the checkpoint") -> tuple[int, int]:
    """(attention heads, KV heads) from config.json, to check the TP degree before any weights load."""
    heads_key, kv_key = HEAD_KEYS[architecture_of(cfg, where)]
    heads = int(cfg[heads_key])
    return heads, int(cfg.get(kv_key) or heads)


def model_path(model: str | None, revision: str | None = None, download_dir: str | None = None) -> Path:
    """The folder to serve: a local folder, a fetched Hugging Face model id, else the embedded demo model."""
    if model is None:
        return embedded_model_path()
    if hub.is_repo_id(model):
        return hub.download(model, architecture_of, revision, download_dir)
    return Path(model).expanduser()


def served_name(model: str | None, path: Path) -> str:
    """The default /v1/models name: the model id as given (vLLM's rule), else the folder name."""
    return model if model is not None and hub.is_repo_id(model) else Path(path).name


def architecture_of(cfg: dict, where: str = "the checkpoint") -> str:
    for name in cfg.get("architectures") or []:
        if name in ARCHITECTURES:
            return name
    if str(cfg.get("model_type", "")).lower() in MODEL_TYPES:
        return MODEL_TYPES[str(cfg["model_type"]).lower()]
    raise ValueError(f"model: {where} is {'/'.join(cfg.get('architectures') or []) or 'an unknown model'} "
                     f"(model_type {cfg.get('model_type')!r}), not a diffusion LLM this server runs; "
                     f"supported: {', '.join(sorted(ARCHITECTURES))}")


def embedded_model_path() -> Path:
    if (ASSET / "config.json").is_file():
        return ASSET
    raise FileNotFoundError(f"model: the embedded demo model is missing from this installation ({ASSET}); "
                            "reinstall dllm-server, or name a checkpoint folder or Hugging Face id")


def read_config(path: str | Path) -> dict:
    folder = Path(path)
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"model: {folder} has no config.json (expected a Hugging Face checkpoint folder)")
    return json.loads(cfg_file.read_text())


def with_token_ids(cfg: dict, folder: str | Path) -> dict:
    """config.json, plus `mask_token_id` from the tokenizer's mask_token where the config has none (LLaDA2)."""
    if "mask_token_id" in cfg:
        return cfg
    folder = Path(folder)
    tok_cfg, tok = folder / "tokenizer_config.json", folder / "tokenizer.json"
    if not (tok_cfg.is_file() and tok.is_file()):
        return cfg
    mask = json.loads(tok_cfg.read_text()).get("mask_token")
    mask = mask.get("content") if isinstance(mask, dict) else mask
    ids = {t["content"]: t["id"] for t in json.loads(tok.read_text()).get("added_tokens", [])}
    return {**cfg, "mask_token_id": ids[mask]} if mask in ids else cfg


def plain_id_offset(special_ids) -> int:
    """The offset for synthetic byte-range prompt ids (0-255) that avoids every special token: 0 where the specials
    sit above the bytes (LLaDA, Dream), 6 for the demo model, whose BPE puts its six specials first."""
    special, offset = set(special_ids), 0
    while hit := [s for s in special if offset <= s < offset + 256]:
        offset = max(hit) + 1
    return offset


def plain_id_offset_of(model: str | None) -> int:
    """plain_id_offset for a checkpoint, read without loading weights."""
    folder = model_path(model)
    cfg = read_config(folder)
    tok = folder / "tokenizer.json"
    special = {t["id"] for t in json.loads(tok.read_text()).get("added_tokens", [])} if tok.is_file() else set()
    for key in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"):
        value = cfg.get(key)
        special |= set(value) if isinstance(value, list) else {value} if isinstance(value, int) else set()
    return plain_id_offset(special)


def generation_config(folder: str | Path, setting: str | None) -> dict:
    """generation_config.json as honoured: "auto" reads the model folder's, a path that folder's, None nothing."""
    if setting is None:
        return {}
    gen = (Path(folder) if setting == "auto" else Path(setting).expanduser()) / "generation_config.json"
    if not gen.is_file():
        if setting != "auto":
            raise ValueError(f"generation_config: {gen} does not exist")
        return {}
    try:
        data = json.loads(gen.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"generation_config: {gen} is not valid JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


def sampling_defaults(gen: dict) -> dict:
    """The request defaults a generation config sets; like vLLM, do_sample is not read."""
    return {field: gen[key] for key, field in GENERATION_DEFAULTS.items() if gen.get(key) is not None}


def request_defaults(folder: str | Path, setting: str | None) -> tuple[dict, dict]:
    """(the generation config, its request defaults), checked at start-up."""
    from .decoding.params import SamplingParams
    gen = generation_config(folder, setting)
    defaults = sampling_defaults(gen)
    try:
        SamplingParams(**defaults)
    except ValueError as exc:
        raise ValueError(f"generation_config: {exc} (start with --generation-config none to ignore it)") from None
    if defaults:
        log.info("request defaults from generation_config.json: %s (--generation-config none ignores them)",
                 ", ".join(f"{k}={v}" for k, v in sorted(defaults.items())))
    return gen, defaults
