"""Each token's bytes, read from a checkpoint's tokenizer.json, for the automaton compiler: byte-level BPE
(GPT-2's byte-to-character map: LLaDA, Dream, SDAR) and SentencePiece-style vocabularies (U+2581 for a space,
<0xNN> byte fallback). Special and added tokens are not text and never enter a constrained answer."""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from ..checkpoint import bytes_to_unicode

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted."""
    return {c: b for b, c in bytes_to_unicode().items()}


def _decoder_kinds(spec: dict | None) -> set[str]:
    if not spec:
        return set()
    if spec.get("type") == "Sequence":
        return set().union(*(_decoder_kinds(d) for d in spec.get("decoders", [])))
    return {spec.get("type")}


def token_bytes(tokenizer_json: dict) -> dict[bytes, list[int]]:
    """bytes -> the ids of the ordinary tokens that spell them (several ids may share one spelling)."""
    model = tokenizer_json.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, list):                      # Unigram: [[piece, score], ...]
        vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
    if not isinstance(vocab, dict):
        raise ValueError("structured output: the tokenizer's vocabulary cannot be read from tokenizer.json")
    added = {t["id"] for t in tokenizer_json.get("added_tokens", [])}
    kinds = _decoder_kinds(tokenizer_json.get("decoder"))
    byte_level = "ByteLevel" in kinds
    dec = _byte_decoder()
    out: dict[bytes, list[int]] = {}
    for piece, i in vocab.items():
        if i in added:
            continue
        if byte_level:
            if any(c not in dec for c in piece):
                continue
            raw = bytes(dec[c] for c in piece)
        else:
            m = _BYTE_TOKEN.fullmatch(piece)
            raw = bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode()
        if raw:
            out.setdefault(raw, []).append(i)
    return out


@functools.lru_cache(maxsize=4)
def vocab_of(folder: str) -> dict[bytes, list[int]]:
    """The token bytes of the checkpoint in `folder` (its tokenizer.json)."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise ValueError("response_format: structured output needs the checkpoint's tokenizer.json")
    return token_bytes(json.loads(path.read_text()))
