"""Loading HF checkpoint folders: sharded == single file, dtypes, clear errors."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllm_server import LLM, SamplingParams
from dllm_server.model.loader import load_model
from dllm_server.model.tiny import make_tiny_model


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_sharded_equals_single(tmp_path, arch):
    single = make_tiny_model(tmp_path / "single", arch=arch, seed=3)
    sharded = make_tiny_model(tmp_path / "sharded", arch=arch, seed=3, shards=3)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("model-*.safetensors"))) == 3
    a, _, _ = load_model(single)
    b, _, _ = load_model(sharded)
    for (na, ta), (nb, tb) in zip(sorted(a.state_dict().items()), sorted(b.state_dict().items())):
        assert na == nb and torch.equal(ta, tb)


def test_parameter_names_are_the_hf_ones(tiny_llada, tiny_dream):
    names = set(load_file(f"{tiny_llada}/model.safetensors"))
    assert "model.transformer.wte.weight" in names
    assert "model.transformer.blocks.1.ff_proj.weight" in names and "model.transformer.ff_out.weight" in names
    names = set(load_file(f"{tiny_dream}/model.safetensors"))
    assert "model.layers.0.self_attn.q_proj.bias" in names and "lm_head.weight" in names


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_checkpoints_load_and_generate(tmp_path, dtype):
    path = make_tiny_model(tmp_path / dtype, arch="llada", dtype=dtype)
    _, _, torch_dtype = load_model(path)
    assert torch_dtype == torch.float32                     # auto on CPU: half precision runs in fp32
    _, _, kept = load_model(path, dtype)
    assert kept == getattr(torch, dtype)
    out = LLM(str(path), block_length=8).generate("hello", SamplingParams(max_tokens=8))[0]
    assert len(out.token_ids) >= 1


def test_missing_tensor_is_named(tmp_path, tiny_llada):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llada, bad)
    state = load_file(bad / "model.safetensors")
    del state["model.transformer.blocks.1.up_proj.weight"]
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=r"blocks\.1\.up_proj\.weight"):
        load_model(bad)


def test_unknown_architecture_is_named(tmp_path, tiny_llada):
    bad = tmp_path / "arch"
    shutil.copytree(tiny_llada, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_model(bad)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load_model(tmp_path)


def test_skip_tokenizer_init_allows_a_folder_without_tokenizer(tmp_path, tiny_dream):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_dream, bare)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (bare / f).unlink()
    llm = LLM(str(bare), skip_tokenizer_init=True, block_length=8)
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=8))[0]
    assert out.token_ids and out.text == ""
    with pytest.raises(ValueError, match="prompt"):
        llm.generate("text needs a tokenizer")


def test_auto_keeps_bf16_on_cpu_when_fp32_weights_would_not_fit(monkeypatch):
    from dllm_server.model import loader
    cfg = {"torch_dtype": "bfloat16"}
    cpu = torch.device("cpu")
    assert loader.resolve_dtype("auto", cfg, cpu, weight_bytes=2**20) == torch.float32
    monkeypatch.setattr(loader, "available_memory_bytes", lambda: 3 * 2**20)
    assert loader.resolve_dtype("auto", cfg, cpu, weight_bytes=2**20) == torch.bfloat16
    assert loader.resolve_dtype("auto", {"torch_dtype": "float16"}, cpu, weight_bytes=2**20) == torch.float32
    assert loader.resolve_dtype("auto", cfg, torch.device("cuda"), weight_bytes=2**20) == torch.bfloat16
