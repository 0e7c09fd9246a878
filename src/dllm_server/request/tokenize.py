"""Tokenizer, chat template and the ids that end an answer (EOS and end-of-turn)."""
from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|im_end|>")
# Classes whose whole behaviour is tokenizer.json: loaded directly, without transformers' class lookup.
PLAIN_FAST = (None, "PreTrainedTokenizerFast", "TokenizersBackend")


def load_hf_tokenizer(folder: Path):
    """A plain fast tokenizer from tokenizer.json directly, anything else through AutoTokenizer; a class that
    needs remote code falls back to tokenizer.json when there is one."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg_file = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    has_json = (folder / "tokenizer.json").is_file()
    if has_json and cfg.get("tokenizer_class") in PLAIN_FAST:
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as exc:
        missing = _missing_sentencepiece(folder)
        if missing and not has_json:
            raise ValueError(f"model: {folder} ships a sentencepiece tokenizer.model, which needs {missing}: "
                             "pip install sentencepiece protobuf (the sentencepiece extra)") from exc
        if has_json:
            log.info("tokenizer class %s did not load (%s); using tokenizer.json", cfg.get("tokenizer_class"), exc)
            return PreTrainedTokenizerFast.from_pretrained(str(folder))
        raise ValueError(f"model: cannot load a tokenizer from {folder} ({exc}); pass "
                         "skip_tokenizer_init=True and token-id prompts") from exc


class Tokenizer:
    def __init__(self, folder: str | Path):
        self.hf = load_hf_tokenizer(Path(folder))
        if not self.hf.chat_template:
            self.hf.chat_template = _template_file(Path(folder))
        self.vocab_size = len(self.hf)
        # A token's string is at least as long as the text it covers (byte-level: a character per byte).
        self.max_token_chars = max(1, max(map(len, self.hf.get_vocab()), default=1))
        self.token_text = functools.lru_cache(maxsize=1 << 16)(self._token_text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        if not self.hf.chat_template:
            raise ValueError("messages: this model's tokenizer has no chat template")
        text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template already holds BOS; encoding must not add a second one.
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return self.hf.decode(token_ids, skip_special_tokens=True)

    def _token_text(self, token_id: int) -> str:
        return self.hf.decode([token_id], skip_special_tokens=False)

    def end_of_turn_ids(self) -> set[int]:
        ids = set()
        for tok in END_OF_TURN_TOKENS:
            tid = self.hf.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != self.hf.unk_token_id and tid is not None:
                ids.add(tid)
        if self.hf.eos_token_id is not None:
            ids.add(self.hf.eos_token_id)
        return ids

    def info(self) -> dict:
        """What /tokenizer_info reports (vLLM's route; lm-evaluation-harness probes it)."""
        hf = self.hf
        return {"tokenizer_class": type(hf).__name__, "eos_token": hf.eos_token, "bos_token": hf.bos_token,
                "pad_token": hf.pad_token, "unk_token": hf.unk_token, "eos_token_id": hf.eos_token_id,
                "bos_token_id": hf.bos_token_id, "vocab_size": self.vocab_size, "chat_template": hf.chat_template}


def _missing_sentencepiece(folder: Path) -> str | None:
    if not (folder / "tokenizer.model").is_file():
        return None
    absent = [pkg for pkg, mod in (("sentencepiece", "sentencepiece"), ("protobuf", "google.protobuf"))
              if _no_module(mod)]
    return " and ".join(absent) or None


def _no_module(name: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:          # a parent package (google) is absent
        return True


def _template_file(folder: Path) -> str | None:
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    if (folder / "chat_template.json").is_file():
        return json.loads((folder / "chat_template.json").read_text()).get("chat_template")
    return None


def stop_token_ids(generation_config: dict, eos_id: int, tokenizer: Tokenizer | None) -> tuple[int, ...]:
    """EOS from config.json and the honoured generation config, plus the tokenizer's end-of-turn tokens."""
    ids = {eos_id}
    eos = generation_config.get("eos_token_id")
    ids.update(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    if tokenizer is not None:
        ids |= tokenizer.end_of_turn_ids()
    return tuple(sorted(ids))
