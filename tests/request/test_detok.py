"""Incremental detokenization equals a full decode, never shows a half character, and decodes
only short windows (the front loop's cost per step does not grow with the answer)."""
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dllm_server.request.detok import REPLACEMENT, IncrementalDetokenizer
from dllm_server.model.tiny import SPECIALS, byte_tokenizer

TEXTS = ["Good morrow, my lord. What news?", "naïve café — ünïcödé ✓ 日本語のテキスト 🙂🙃 done",
         "tabs\tand\nnewlines  and   spaces", "ascii only, a longer sentence " * 8]


def _check(decode, ids, rng):
    d = IncrementalDetokenizer(decode)
    calls = []

    def counting(t):
        calls.append(len(t))
        return decode(t)
    d.decode = counting
    seen, i = "", 0
    while i < len(ids):
        n = rng.choice([1, 1, 2, 3, 8])
        d.push(ids[i:i + n])
        i += n
        assert d.text.startswith(seen) and not d.text.endswith(REPLACEMENT)
        seen = d.text
    assert d.flush() == decode(ids)
    return max(calls)


def test_byte_level_pieces_match_a_full_decode():
    tok = byte_tokenizer(SPECIALS["llada"])
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)      # noqa: E731
    rng = random.Random(0)
    for text in TEXTS:
        ids = tok.encode(text).ids
        assert len(ids) == len(text.encode())                          # one token per byte: characters split
        widest = _check(decode, ids, rng)
        assert widest <= 3 * 8 + 4                                     # windows, not the whole prefix
    garbage = [rng.randrange(256) for _ in range(300)]                  # invalid UTF-8 too
    _check(decode, garbage, rng)


def test_metaspace_tokenizer_keeps_its_spaces():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(TEXTS * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"]))
    decode = lambda ids: tok.decode(ids)                                # noqa: E731
    rng = random.Random(1)
    for text in TEXTS[:1] + TEXTS[2:]:
        _check(decode, tok.encode(text).ids, rng)
