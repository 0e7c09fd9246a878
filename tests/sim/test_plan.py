"""The planner: candidates, a capacity search over simulated runs, the ranked table and the CLI."""
import json

from dllm_server.cli import main
from dllm_server.sizing import build_setup, candidates, capacity, plan, table


def test_candidates_cover_budgets_and_every_split():
    names = [c.name for c in candidates(3, taus=(1024, None))]
    assert names == ["colocated x3, tau=1024", "colocated x3, tau=inf", "1P2D (disaggregated)",
                     "1P2C (hybrid, theta=8192)", "2P1D (disaggregated)", "2P1C (hybrid, theta=8192)"]
    c = candidates(3)[-1].changes
    assert c["num_workers"] + c["num_prefill_workers"] == 3 and c["placement"] == "hybrid"


def test_capacity_meets_the_slo_and_the_next_rate_up_does_not():
    setup = build_setup("llada-8b", "h100", "sharegpt", None, 30, "p90", 6.0, num_workers=2)
    r = capacity(setup, {"num_workers": 2}, start_rate=2.0, tolerance=0.3)
    assert r["capacity_req_s"] > 0 and r["at_capacity"]["p90_s"] <= 6.0 and r["upper_req_s"] > r["capacity_req_s"]
    rows = plan(setup, candidates(2, taus=(1024, None), splits=False), start_rate=2.0, tolerance=0.5, progress=False)
    assert [r["capacity_req_s"] for r in rows] == sorted((r["capacity_req_s"] for r in rows), reverse=True)
    assert "recommendation (simulated)" in table(rows, setup)


def test_cli_plan_prints_json_and_writes_a_plot(tmp_path, capsys):
    out = tmp_path / "plan.png"
    assert main(["plan", "--workers", "2", "--requests", "20", "--taus", "1024", "--tolerance", "0.5",
                 "--slo-s", "8", "--json", "--plot", str(out), "--model", "dream-7b", "--workload", "arxiv"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["simulated"] and len(data["ranking"]) == 3 and out.stat().st_size > 0
    assert data["assumptions"]["cost"]["model"]["name"] == "dream-7b"
