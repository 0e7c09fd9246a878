"""The files users' checkpoints bring: tokenizers as tokenizer.json, as a sentencepiece
tokenizer.model or as vocab.json + merges.txt named by tokenizer_config.json, with the chat template
in chat_template.jinja; and generation_config.json defaults honoured as vLLM honours them
(request fields win; --generation-config none ignores the file)."""
import io
import json
import shutil

import pytest

from dllm_server import LLM, SamplingParams
from dllm_server.api.protocol import CompletionRequest
from dllm_server.checkpoint import request_defaults
from dllm_server.request.tokenize import Tokenizer
from dllm_server.model.tiny import LLADA_TEMPLATE, SPECIALS, bytes_to_unicode


def _copy(src, dst, drop=()):
    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    return dst


def _without_template(folder):
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    return cfg


def test_tokenizer_json_with_a_separate_chat_template_jinja(tiny_llada, tmp_path):
    folder = _copy(tiny_llada, tmp_path / "m")
    (folder / "tokenizer_config.json").write_text(json.dumps(_without_template(folder)))
    (folder / "chat_template.jinja").write_text(LLADA_TEMPLATE)
    tok = Tokenizer(folder)
    assert tok.hf.chat_template == LLADA_TEMPLATE
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}]) == \
        Tokenizer(tiny_llada).apply_chat_template([{"role": "user", "content": "Hi"}])


def test_bpe_vocab_named_by_tokenizer_config_loads_through_transformers_and_serves(tiny_llada, tmp_path):
    """No tokenizer.json: GPT2Tokenizer over vocab.json + merges.txt (the same byte-level ids)."""
    folder = _copy(tiny_llada, tmp_path / "m", drop=("tokenizer.json",))
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab.update({s: 256 + i for i, s in enumerate(SPECIALS["llada"])})
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    cfg = _without_template(folder)
    cfg.update(tokenizer_class="GPT2Tokenizer", added_tokens_decoder={
        str(256 + i): {"content": s, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                       "single_word": False} for i, s in enumerate(SPECIALS["llada"])})
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "chat_template.jinja").write_text(LLADA_TEMPLATE)
    tok, ref = Tokenizer(folder), Tokenizer(tiny_llada)
    assert "GPT2" in type(tok.hf).__name__
    msgs = [{"role": "user", "content": "Good morrow, héllo"}]
    assert tok.apply_chat_template(msgs) == ref.apply_chat_template(msgs)
    assert tok.decode(tok.encode("wörld 日本")) == "wörld 日本"
    out = LLM(str(folder), block_length=8).chat(msgs, SamplingParams(max_tokens=8))[0]
    assert out.finish_reason in ("stop", "length") and out.stats.num_forwards >= 1


def test_sentencepiece_tokenizer_model(tiny_llada, tmp_path):
    spm = pytest.importorskip("sentencepiece", reason="the sentencepiece extra (sentencepiece, protobuf) is not installed")
    pytest.importorskip("google.protobuf", reason="transformers reads tokenizer.model through protobuf (the "
                        "sentencepiece extra)")
    folder = _copy(tiny_llada, tmp_path / "m", drop=("tokenizer.json", "tokenizer_config.json"))
    model = io.BytesIO()
    lines = ["Good morrow, my lord.", "What news?", "But soft, what light through yonder window breaks?",
             "ROMEO. JULIET. NURSE."] * 25
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=96,
                                   character_coverage=1.0, hard_vocab_limit=False, bos_id=1, eos_id=2, unk_id=0)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False}))
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    tok = Tokenizer(folder)
    ids = tok.encode("What news?")
    assert ids[0] == 1 and tok.decode(ids) == "What news?"               # BOS added, round trip
    assert tok.info()["eos_token"] == "</s>" and tok.apply_chat_template([{"role": "user", "content": "Hi"}])


@pytest.fixture(scope="module")
def tuned(tiny_llada, tmp_path_factory):
    """A checkpoint whose generation_config.json recommends sampling settings and a second EOS."""
    folder = _copy(tiny_llada, tmp_path_factory.mktemp("gen") / "m")
    eos = json.loads((folder / "config.json").read_text())["eos_token_id"]
    (folder / "generation_config.json").write_text(json.dumps({
        "eos_token_id": [eos, 65], "temperature": 0.8, "top_k": 20, "top_p": None, "max_new_tokens": 12,
        "do_sample": True}))
    return folder


def test_generation_config_defaults_and_eos_ids(tuned):
    gen, defaults = request_defaults(tuned, "auto")
    assert defaults == {"temperature": 0.8, "top_k": 20, "max_tokens": 12} and gen["eos_token_id"][1] == 65
    assert request_defaults(tuned, None) == ({}, {})
    llm = LLM(str(tuned), block_length=8)
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.8, top_k=20, max_tokens=12)
    assert 65 in llm.stop_ids
    assert len(llm.generate({"prompt_token_ids": [1, 2, 3]})[0].token_ids) <= 12
    plain = LLM(str(tuned), block_length=8, generation_config=None)
    assert plain.get_default_sampling_params() == SamplingParams() and 65 not in plain.stop_ids


def test_request_fields_win_over_generation_config_defaults():
    defaults = {"temperature": 0.8, "top_k": 20, "max_tokens": 12}
    p = CompletionRequest.model_validate({"prompt": "x"}).sampling_params(16, defaults)
    assert (p.temperature, p.top_k, p.max_tokens) == (0.8, 20, 12)
    p = CompletionRequest.model_validate({"prompt": "x", "temperature": 0.0, "max_tokens": 5,
                                          "top_k": 0}).sampling_params(16, defaults)
    assert (p.temperature, p.top_k, p.max_tokens) == (0.0, 0, 5)


def test_a_generation_config_a_request_could_not_carry_is_named(tiny_llada, tmp_path):
    folder = _copy(tiny_llada, tmp_path / "m")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": -1}))
    with pytest.raises(ValueError, match="generation_config"):
        request_defaults(folder, "auto")
    with pytest.raises(ValueError, match="generation_config"):
        request_defaults(folder, str(tmp_path / "nowhere"))
