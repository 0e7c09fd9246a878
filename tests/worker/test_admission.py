"""The deficit token-budget admission function, exhaustively and under random load."""
import random

import pytest

from dllm_server.worker.admission import Admission, PrefillCandidate, admit, credit_floor, seat_decodes


def cand(i, cost, pages=1):
    return PrefillCandidate(f"r{i}", i, cost, pages)


def run(waiting, **kw):
    base = dict(decode_tokens=0, token_budget=1024, deficit_tokens=0, free_pages=1000, num_active=1,
                num_ready=0, max_active_decodes=64)
    base.update(kw)
    return admit(waiting, **base)


def test_strict_arrival_order_no_overtaking():
    a = run([cand(0, 900), cand(1, 200), cand(2, 10)])
    assert a.admitted == ("r0",)        # r1 would exceed; r2 must not jump ahead of it


def test_prefill_is_never_split_and_budget_respected():
    a = run([cand(0, 600), cand(1, 600)], decode_tokens=100)
    assert a.admitted == ("r0",) and a.deficit_tokens == 1024 - 100 - 600


def test_idle_rule_admits_oversized_head():
    a = run([cand(0, 5000), cand(1, 10)], num_active=0)
    assert a.admitted == ("r0",) and a.deficit_tokens == 0


def test_deficit_resets_when_nothing_waits():
    assert run([], deficit_tokens=777) == Admission((), 0, False)


def test_deficit_resets_when_every_waiting_block_went_in():
    # a light turn leaves no credit behind: a burst arriving next is admitted under the budget
    a = run([cand(0, 91)], deficit_tokens=300)
    assert a.admitted == ("r0",) and a.deficit_tokens == 0
    burst = [cand(i, 92) for i in range(1, 22)]
    b = run(burst, deficit_tokens=a.deficit_tokens)
    assert len(b.admitted) == 1024 // 92 and b.deficit_tokens == 1024 - 92 * (1024 // 92)


def test_deficit_accumulates_until_the_head_fits():
    deficit, iters = 0, 0
    while True:
        a = run([cand(0, 3000)], decode_tokens=800, deficit_tokens=deficit)
        iters += 1
        if a.admitted:
            break
        assert a.deficit_tokens > deficit >= 0
        deficit = a.deficit_tokens
    assert iters == -(-3000 // (1024 - 800))


def test_memory_stall_earns_no_credit():
    a = run([cand(0, 100, pages=50)], free_pages=10, deficit_tokens=300)
    assert a.memory_stalled and a.admitted == () and a.deficit_tokens == 300
    b = run([cand(0, 200, pages=5), cand(1, 100, pages=50)], free_pages=10, deficit_tokens=300, decode_tokens=1000)
    assert b.admitted == ("r0",) and b.memory_stalled and b.deficit_tokens == 300 - (200 - credit_floor(1024, 0.125))


def test_page_holders_pass_a_head_stalled_on_memory_and_nothing_else_does():
    # r0 waits for 50 pages; r1 and r3 are continued blocks holding theirs (the only way pages come
    # back); r2 needs pages and must not take them ahead of r0, even though 5 would fit.
    w = [cand(0, 100, pages=50), cand(1, 100, pages=0), cand(2, 10, pages=5), cand(3, 100, pages=0)]
    a = run(w, free_pages=10, num_active=0)
    assert a.admitted == ("r1", "r3") and a.memory_stalled
    b = run(w, free_pages=10, decode_tokens=1024 - 150, deficit_tokens=0)   # the budget still binds holders
    assert b.admitted == ("r1",) and b.memory_stalled


def test_seat_cap_bounds_in_flight_blocks():
    a = run([cand(i, 10) for i in range(5)], num_active=1, num_ready=1, max_active_decodes=4)
    assert a.admitted == ("r0", "r1") and a.seat_stalled
    assert seat_decodes(5, num_active=3, max_active_decodes=4) == 1
    assert seat_decodes(5, num_active=6, max_active_decodes=4) == 0


def test_unlimited_budget_is_prefill_priority():
    a = run([cand(i, 4000) for i in range(3)], token_budget=None, decode_tokens=10 ** 6)
    assert a.admitted == ("r0", "r1", "r2") and a.deficit_tokens == 0


@pytest.mark.parametrize("seed", range(20))
def test_no_starvation_and_non_negative_deficit_under_any_decode_load(seed):
    """Random, even permanently overloaded, decode loads: the head waits a bounded time."""
    rng = random.Random(seed)
    budget = rng.choice([256, 1024, 4096])
    floor = credit_floor(budget, 0.125)
    waiting = [cand(i, rng.randrange(1, 3 * budget)) for i in range(30)]
    deficit, waited = 0, 0
    while waiting:
        decode_tokens = rng.choice([0, budget // 2, budget, 4 * budget, 100 * budget])
        a = run(waiting, decode_tokens=decode_tokens, token_budget=budget, deficit_tokens=deficit, num_active=1)
        assert a.deficit_tokens >= 0
        deficit = a.deficit_tokens
        if a.admitted:
            assert a.admitted == tuple(c.request_id for c in waiting[: len(a.admitted)])
            waiting = waiting[len(a.admitted):]
            waited = 0
        else:
            waited += 1
            assert waited <= -(-waiting[0].cost_tokens // floor)
