"""The chaos run's short form (tests/reliability/chaos.py): each fault kind once over 50 s of steady load on two
TP=2 instances with the SLO policy and the prefix cache. Nothing lost, nothing ended twice, every fault recovered,
fixed-rule answers equal to the fault-free server's, no KV page held afterwards."""
from __future__ import annotations

from dllm_server.model.tiny import make_tiny_model

from .chaos import KINDS, STALL_S, chaos, fault_free, summary


def test_chaos_short_form(tmp_path, figures):
    model = str(make_tiny_model(tmp_path / "tiny-sdar", arch="sdar", seed=1))
    reference = fault_free(model, tmp_path, seed=0)
    s = summary(chaos(model, 50, 0, tmp_path, per_kind=1, reference=reference))
    for row in s["faults"]:
        figures(f"chaos: {row['fault']}", **{k: v for k, v in row.items() if k != "fault"})
    figures("chaos: requests", **{k: v for k, v in s.items() if k != "faults"})
    rows = {r["fault"]: r for r in s["faults"]}
    assert [rows[k]["injected"] for k in KINDS] == [1] * len(KINDS)
    assert all(r["not recovered"] == 0 and r["recover s (max)"] < 60 for r in s["faults"])
    assert all(r["processes leaked"] in (0, None) and r["failed checks"] == [] for r in s["faults"]), s["faults"]
    assert rows["sigterm_in_regroup"]["processes leaked"] == 0
    assert rows["stop_tp_rank"]["detect s (mean)"] < STALL_S + 5
    assert rows["kill_worker"]["requests affected"] + rows["kill_tp_rank"]["requests affected"] > 0
    assert s["lost"] == s["double endings"] == s["wrong answers"] == s["cut short"] == 0
    assert s["pages leaked (kv usage)"] == s["leases leaked"] == 0
    assert s["answered"] + s["clear errors"] == s["requests"]
    assert s["clear errors"] == s["refused 503"]            # the only errors: the queue's refusals (a burst's)
