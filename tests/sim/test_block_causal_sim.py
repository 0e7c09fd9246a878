"""The simulator runs block-causal requests through the real scheduler and worker core: one
prefill per request (no re-prefill), blocks on the absolute grid (a partial first block holds the
prompt's tail), fixed-steps commits as planned, every request finished."""
from dllm_server.config import ServerConfig
from dllm_server.decoding.canvas import num_blocks
from dllm_server.sim.behaviour import ParametricBehaviour, SimRequest
from dllm_server.sim.cluster import Simulator
from dllm_server.costmodel.gpu import MODELS, gpu_cost


def _sim(model: str, block: int, reqs, record=True):
    shape = MODELS[model]
    cost = gpu_cost(model, "h100", block_length=block)
    cfg = ServerConfig(block_length=block, max_waiting_requests=1 << 20, num_pages=4096)
    return Simulator(cfg, cost, ParametricBehaviour("llada-8b"), shape.model_info(), record=record).run(reqs)


def test_sdar_requests_prefill_once_and_finish():
    reqs = [SimRequest(0.01 * i, 37 + 5 * i, 20 + 3 * i, steps=num_blocks(20 + 3 * i, 4, 37 + 5 * i, True) * 2)
            for i in range(12)]
    res = _sim("sdar-8b", 4, reqs)
    assert all(r.finish_reason == "length" for r in res.requests)
    assert [r.tokens for r in res.requests] == [q.max_tokens for q in reqs]
    # two forwards per block on the absolute grid, fewer where the first block has one answer cell
    expected = [sum(min(2, 4 - max(0, q.prompt_len - b * 4))
                    for b in range(q.prompt_len // 4, -(-(q.prompt_len + q.max_tokens) // 4))) for q in reqs]
    assert [r.forwards for r in res.requests] == expected and expected != [q.steps for q in reqs]
    prefills = sum(row[2] for log in res.iterations.values() for row in log)
    assert prefills == len(reqs)                      # one prefill each, nothing re-prefilled
    assert res.counters.blocks_continued == sum(num_blocks(q.max_tokens, 4, q.prompt_len, True) - 1 for q in reqs)


def test_llada_re_prefills_every_block_in_the_same_simulator():
    reqs = [SimRequest(0.01 * i, 37, 32, steps=16) for i in range(4)]
    res = _sim("llada-8b", 4, reqs)
    prefills = sum(row[2] for log in res.iterations.values() for row in log)
    assert prefills == 4 * num_blocks(32, 4)          # a full-canvas forward per block
