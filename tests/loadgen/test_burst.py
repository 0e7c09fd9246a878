"""The BurstGPT-like trace: per-phase rates and burstiness, seeded, readable by the load generator's
trace parser and replayed by the simulator's workload."""
import numpy as np
import pytest

from loadgen.arrivals import parse_trace_lines
from loadgen.burst import burst_rows, from_burstgpt_csv, main, parse_phase_lengths, phase_arrivals, scaled_phases
from loadgen.workload import PRESETS


def test_each_phase_runs_at_its_rate_with_gamma_burstiness():
    phases = scaled_phases(10.0, (0.3, 0.9, 1.4, 0.5), 600.0)
    assert phases == [(600.0, 3.0), (600.0, 9.0), (600.0, 14.0), (600.0, 5.0)]
    for shape, cv in ((0.5, 2 ** 0.5), (0.25, 2.0)):
        times, phase = phase_arrivals(phases, shape, np.random.default_rng(3))
        assert times[0] == 0.0 and (np.diff(times) >= 0).all() and times[-1] < 2400.0
        for k, (duration, rate) in enumerate(phases):
            t = times[phase == k]
            assert ((t >= 600.0 * k) & (t < 600.0 * (k + 1))).all()
            assert len(t) / duration == pytest.approx(rate, rel=0.12)
            gaps = np.diff(t)
            assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.2)


def test_rows_are_seeded_sharegpt_like_and_parse_as_a_trace():
    phases = [(60.0, 5.0), (60.0, 1.0)]
    a, b = burst_rows(phases, seed=7), burst_rows(phases, seed=7)
    assert a == b and a != burst_rows(phases, seed=8)
    big = burst_rows([(2000.0, 5.0)], seed=1)
    assert np.median([r["prompt_len"] for r in big]) == pytest.approx(PRESETS["sharegpt"][0], rel=0.1)
    assert np.median([r["output_len"] for r in big]) == pytest.approx(PRESETS["sharegpt"][2], rel=0.1)
    assert all(r["prompt_len"] + r["output_len"] <= 4096 for r in big)
    import json
    entries = parse_trace_lines(["# header"] + [json.dumps(r) for r in a])
    assert [e.timestamp for e in entries] == [r["timestamp"] for r in a]
    assert [e.prompt_len for e in entries] == [r["prompt_len"] for r in a]


def test_phase_lengths_scale_each_phase_and_keep_the_draws():
    phases = [(400.0, 5.0), (400.0, 5.0)]
    plain = burst_rows(phases, seed=3)
    assert burst_rows(phases, seed=3, phase_lengths=[(1, 1), (1, 1)]) == plain
    mixed = burst_rows(phases, seed=3, phase_lengths=[(3.0, 0.5), (0.5, 3.0)])
    assert [r["timestamp"] for r in mixed] == [r["timestamp"] for r in plain]
    for k, (p, o) in enumerate([(3.0, 0.5), (0.5, 3.0)]):
        a = [r for r in plain if r["phase"] == k]
        b = [r for r in mixed if r["phase"] == k]
        assert np.median([r["prompt_len"] for r in b]) == pytest.approx(p * np.median([r["prompt_len"] for r in a]),
                                                                         rel=0.1)
        assert np.median([r["output_len"] for r in b]) == pytest.approx(o * np.median([r["output_len"] for r in a]),
                                                                         rel=0.1)
    assert all(r["prompt_len"] + r["output_len"] <= 4096 for r in mixed)
    with pytest.raises(ValueError, match="2 phases"):
        burst_rows(phases, phase_lengths=[(1, 1)])
    assert parse_phase_lengths("3:0.5,0.5:3") == [(3.0, 0.5), (0.5, 3.0)]
    for bad in ("3", "3:x", "0:1", "1:-1"):
        with pytest.raises(ValueError, match="prompt:output"):
            parse_phase_lengths(bad)


def test_cli_writes_a_trace_the_simulator_replays(tmp_path, capsys):
    out = tmp_path / "burst.jsonl"
    assert main(["--out", str(out), "--reference-rate", "4", "--scales", "0.5,2", "--phase-s", "30",
                 "--seed", "2"]) == 0
    text = out.read_text()
    assert text.startswith("# SYNTHETIC BurstGPT-like trace")
    from dllm_server.sim.workload import trace_workload
    reqs = trace_workload(out)
    rows = burst_rows(scaled_phases(4.0, (0.5, 2.0), 30.0), seed=2)
    assert len(reqs) == len(rows) and [r.arrival_s for r in reqs] == pytest.approx([r["timestamp"] for r in rows])
    assert [r.max_tokens for r in reqs] == [r["output_len"] for r in rows]


def test_a_burstgpt_csv_converts_to_the_same_rows(tmp_path):
    csv = tmp_path / "BurstGPT_1.csv"
    csv.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                   "10,ChatGPT,472,18,490,Conversation log\n5,GPT-4,1200,0,1200,API log\n"
                   "2,GPT-4,300,200,500,API log\n")
    rows = from_burstgpt_csv(csv, speed=2.0)
    assert rows == [{"timestamp": 1.0, "prompt_len": 300, "output_len": 200},
                    {"timestamp": 5.0, "prompt_len": 472, "output_len": 18}]          # the failure left out
    assert [r["prompt_len"] for r in from_burstgpt_csv(csv, model="GPT-4", skip_failed=False)] == [300, 1200]
