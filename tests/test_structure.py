"""The package's shape holds (scripts/check_imports.py): every package imports only what its layer
allows, no import circle of any length (imports inside functions counted), no module over 400
lines, and the checker itself sees a violation when there is one."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_imports.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_imports", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_layers_hold_with_no_import_cycle_and_small_modules():
    c = _checker()
    g = c.graph()
    assert "dllm_server.scheduler.scheduler" in g and len(g) > 40
    assert c.problems(g) == []
    assert c.main([]) == 0
    # imports inside functions count: checkpoint reads SamplingParams inside request_defaults
    assert "dllm_server.decoding.params" in g["dllm_server.checkpoint"]


def test_the_checker_sees_cycles_and_layer_crossings():
    c = _checker()
    assert c.cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
    assert c.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert c.layer_violations({"dllm_server.api.x": {"dllm_server.worker.core"}}) == [
        "dllm_server.api.x imports dllm_server.worker.core (api may not import worker)"]
    assert c.layer_violations({"dllm_server.policy.x": {"dllm_server.scheduler.scheduler"}}) != []
    assert c.layer_violations({"dllm_server.decoding.x": {"dllm_server.config"}}) != []
    assert c.layer_violations({"dllm_server.newpkg.x": set()}) != []       # every package needs a rule
    assert c.cycles_of_packages({"dllm_server.a.x": {"dllm_server.b.y"}, "dllm_server.b.y": {"dllm_server.a.z"},
                                 "dllm_server.a.z": set()}) != []


def test_every_module_path_docs_architecture_names_exists():
    import re
    root = Path(__file__).resolve().parents[1]
    pkg = root / "src" / "dllm_server"
    text = (root / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"(?<![\w/.-])((?:[\w]+/)*\w+\.py)\b", text))
    assert len(named) > 30
    missing = [p for p in sorted(named) if not ((pkg / p).exists() or (root / p).exists()
                                                 or ("/" not in p and any(pkg.rglob(p))))]
    assert missing == [], missing
