"""Tiny checkpoints carry a real tokenizer.json and the family's chat template."""
from dllm_server import LLM, SamplingParams
from dllm_server.request.tokenize import Tokenizer


def test_llada_chat_template_has_one_bos_and_real_special_ids(tiny_llada):
    tok = Tokenizer(tiny_llada)
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi there"}])
    bos = tok.hf.convert_tokens_to_ids("<|startoftext|>")
    assert ids.count(bos) == 1 and ids[0] == bos
    text = tok.hf.decode(ids)
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert "<|eot_id|>" in text
    assert tok.hf.convert_tokens_to_ids("<|eot_id|>") in tok.end_of_turn_ids()


def test_dream_chatml_template(tiny_dream):
    tok = Tokenizer(tiny_dream)
    text = tok.hf.decode(tok.apply_chat_template([{"role": "user", "content": "Hi"}]))
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")


def test_byte_tokenizer_round_trips_any_text(tiny_llada):
    tok = Tokenizer(tiny_llada)
    s = "Héllo, wörld! 日本語 \n\t end"
    assert tok.decode(tok.encode(s)) == s


def test_chat_generates(tiny_dream):
    llm = LLM(tiny_dream, block_length=8)
    out = llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(max_tokens=16))[0]
    assert out.finish_reason in ("stop", "length") and out.stats.num_forwards >= 1
