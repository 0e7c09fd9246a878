"""The CLI is generated from ServerConfig: every field has a flag with help; defaults are the
dataclass's own."""
import dataclasses

import pytest

from dllm_server.cli import build_parser, config_from_args
from dllm_server.config import ServerConfig, config_fields


def test_every_config_field_has_a_serve_flag_with_help():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {a.dest: a for a in serve._actions}
    for f in config_fields():
        assert f.name in flags, f.name
        assert f.metadata.get("help"), f.name
        assert flags[f.name].help
        if f.name != "model":      # the positional says "the embedded demo model" instead of None
            assert str(f.default) in flags[f.name].help


def test_unset_flags_keep_dataclass_defaults():
    cfg = config_from_args(build_parser().parse_args(["serve"]))
    assert cfg == ServerConfig()


def test_flags_parse_into_config(monkeypatch):
    monkeypatch.setenv("DLLM_API_KEY", "k")
    ns = build_parser().parse_args(["serve", "/m", "--token-budget", "none", "--placement", "hybrid",
                                    "--no-restart-workers", "--threshold", "0.8"])
    cfg = config_from_args(ns)
    assert (cfg.model, cfg.token_budget, cfg.placement, cfg.restart_workers, cfg.threshold, cfg.api_key) == \
        ("/m", None, "hybrid", False, 0.8, "k")


def test_bad_flag_values_are_rejected():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--placement", "sideways"])
    with pytest.raises(ValueError, match="block_length"):
        config_from_args(build_parser().parse_args(["serve", "--block-length", "0"]))


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ServerConfig().block_length = 3


def test_serve_with_a_bad_model_folder_fails_with_one_line(tmp_path, capsys):
    from dllm_server.cli import main
    assert main(["serve", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "Traceback" not in err


@pytest.mark.parametrize("field,value", [("placement", "sideways"), ("attention_backend", "triton"), ("cache", "full"),
                                         ("kv_transfer", "carrier-pigeon"), ("device", "tpu"), ("dtype", "int8")])
def test_every_choice_field_is_validated_in_the_config(field, value):
    with pytest.raises(ValueError, match=field):
        ServerConfig(**{field: value})


def test_worker_policy_rules_live_in_the_config():
    for bad in ({"token_budget": 0}, {"max_active_decodes": 0}, {"credit_share": 0.0}, {"credit_share": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ServerConfig(**bad)
    w = ServerConfig(token_budget=None, credit_share=0.25).worker_config()
    assert w.policy.token_budget is None and w.policy.credit_share == 0.25
    assert not hasattr(w, "api_key")            # workers get only what they need


def test_serve_with_an_invalid_tensor_parallel_degree_fails_with_one_line_before_loading(tiny_llada, capsys):
    from dllm_server.cli import main
    assert main(["serve", tiny_llada, "--tensor-parallel-size", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dllm-server: error: tensor_parallel_size: 3 does not divide the model's 4 attention heads and "
                   "4 KV heads (allowed: 1, 2, 4)"]


def test_flags_come_in_sections_and_the_configuration_page_is_current():
    import subprocess
    import sys
    from pathlib import Path

    from dllm_server.config import SECTIONS, section_of
    names = [f.name for f in config_fields()]
    assert sorted(names) == sorted(f.name for s in SECTIONS for f in dataclasses.fields(s))   # each in one section
    assert section_of("token_budget").SECTION == "scheduling" and section_of("port").SECTION == "HTTP"
    assert not {"causal", "fail_every_n_forwards", "hang_at_forward"} & set(names)   # test hooks: TestHooks
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert all(f"{s.SECTION} options" in help_text for s in SECTIONS)
    script = Path(__file__).resolve().parents[1] / "scripts" / "config_docs.py"
    run = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def test_test_hooks_parse_and_reject_unknown_names():
    from dllm_server.config import TestHooks
    assert TestHooks.parse("") == TestHooks()
    assert TestHooks.parse("causal=1, hang_at_forward=40") == TestHooks(causal=True, hang_at_forward=40)
    with pytest.raises(ValueError, match="unknown hook 'hang'"):
        TestHooks.parse("hang=3")
    assert ServerConfig().worker_config(TestHooks(fail_every_n_forwards=5)).hooks.fail_every_n_forwards == 5


@pytest.mark.parametrize("field,value,message", [("port", 0, "port: must be in [1, 65535], got 0"),
                                                 ("threshold", 1.5, "threshold: must be in [0.0, 1.0], got 1.5"),
                                                 ("keep_alive_s", 0.0, "keep_alive_s: must be > 0.0, got 0.0"),
                                                 ("tensor_parallel_size", True, "must be a number"),
                                                 ("served_model_name", "", "must not be empty")])
def test_field_rules_come_from_the_field_metadata(field, value, message):
    with pytest.raises(ValueError) as e:
        ServerConfig(**{field: value})
    assert message in str(e.value)
