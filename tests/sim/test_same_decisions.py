"""The simulator makes the real engine's decisions: the offline LLM (the real model, the real
WorkerCore, its own in-process loop) and the simulator (the real Scheduler and WorkerCore, the
stepper replaced by a replay of what the LLM's model did) run the same closed batch, and every
iteration admits the same prefills and seats the same decodes, with the same deficit. Admission
is budget-, seat- and memory-limited here; some answers end at an EOS the model sampled, blocks
take one forward (threshold 0), a fixed number or one per position."""
import re

from dllm_server import LLM, SamplingParams
from dllm_server.config import ServerConfig
from dllm_server.sim.behaviour import ReplayBehaviour, requests_from_rows, rows_from_outputs
from dllm_server.sim.cluster import Simulator
from dllm_server.costmodel.fitted import FittedCost

SCHED = dict(block_length=8, token_budget=64, max_active_decodes=3, num_pages=24, page_size=16)


class Recording:
    """A Stepper that notes what each forward ran (by arrival order, block, step) and the deficit
    the admission left, then runs the wrapped one."""

    def __init__(self, inner, core):
        self.inner, self.core, self.log = inner, core, []

    def fed_tokens(self, t, is_prefill):
        return self.inner.fed_tokens(t, is_prefill)

    def run(self, prefills, decodes, layer_done):
        def key(t):
            return int(re.search(r"(\d+)$", t.request_id).group(1)), t.block_index, t.step
        self.log.append(([key(t) for t in prefills], [key(t) for t in decodes], self.core.deficit_tokens))
        return self.inner.run(prefills, decodes, layer_done)


def test_simulator_admits_what_the_real_engine_admits(tiny_model):
    llm = LLM(tiny_model, dtype="float32", **SCHED)
    llm.core.stepper = Recording(llm.core.stepper, llm.core)
    n = 16
    params = [SamplingParams(max_tokens=(24, 40, 64, 50)[i % 4], temperature=1.0, seed=i + 7,   # seeds where both tiny models sample EOS
                             **({"threshold": 0.0}, {"steps": 3 * (-(-(24, 40, 64, 50)[i % 4] // 8))},
                                {"threshold": 0.9})[i % 3]) for i in range(n)]
    prompts = [{"prompt_token_ids": [(7 * i + j) % 200 + 1 for j in range(8 + 13 * (i % 5))]} for i in range(n)]
    outs = llm.generate(prompts, params)
    real = llm.core.stepper.log
    assert any(o.finish_reason == "stop" for o in outs) and any(len(p) > 1 for p, _, _ in real)

    rows = rows_from_outputs(outs, params)
    cost = FittedCost({"cache": {"turn": [1e-3, 1e-5, 0.0], "forward": [5e-4, 1e-5, 0.0]}}, message_latency_s=0.0,
                      idle_turn_s=1e-4, kv_bytes_per_token=1, link_bytes_per_s=1e9, num_layers=4)
    sim = Simulator(ServerConfig(**SCHED), cost, ReplayBehaviour(rows), llm.model_info,
                    logit_shift=llm.args.logit_shift)
    core = sim.workers[0].core
    core.stepper = Recording(core.stepper, core)
    result = sim.run(requests_from_rows(rows))
    assert result.unfinished == 0
    assert core.stepper.log == real                       # iteration by iteration
    by_seq = {r.seq: r for r in result.requests}
    assert [by_seq[i].forwards for i in range(n)] == [o.stats.num_forwards for o in outs]
    assert [by_seq[i].tokens for i in range(n)] == [len(o.token_ids) for o in outs]
    assert [by_seq[i].finish_reason for i in range(n)] == [o.finish_reason for o in outs]
