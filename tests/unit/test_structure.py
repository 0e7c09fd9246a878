"""The package's shape holds: no import circle of any length (imports inside functions counted), the front process reaches the worker side only
through engine/worker_pool.py, no module over 400 lines, the Scheduler under 250."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_imports.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_imports", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_cycle_and_one_seam_and_small_modules(capsys):
    c = _checker()
    g = c.graph()
    assert "dllm_server.engine.scheduler" in g and len(g) > 40
    assert c.cycles(g) == []
    assert c.seam_violations(g) == []
    assert c.size_violations() == []
    # the checker itself sees a circle and a seam crossing when there is one
    assert c.cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
    assert c.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    # imports inside functions count: checkpoint reads SamplingParams inside request_defaults
    assert "dllm_server.decoding.params" in g["dllm_server.checkpoint"]
    assert c.seam_violations({"dllm_server.api.x": {"dllm_server.worker.core"}}) != []
    assert c.main() == 0
