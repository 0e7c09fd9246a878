"""Deadline ordering (scheduler/ordering.py) as pure functions: deadline order, arrival tie-breaks, late requests
yield, and no request waits unboundedly behind a stream of tighter ones."""
import heapq
import random

from dllm_server.scheduler.ordering import DEADLINE, FCFS, block_priority, deadline_at, is_late

HORIZON = 30.0


def prio(arrived, slo, late=False, order=DEADLINE):
    return block_priority(order, arrived, slo, HORIZON, late)


def test_fcfs_gives_every_block_the_same_priority_so_arrival_order_decides():
    assert {prio(t, s, late, FCFS) for t in (0.0, 5.0) for s in (None, 0.5) for late in (False, True)} == {0.0}


def test_deadline_order_is_earliest_deadline_first():
    assert deadline_at(10.0, 2.0, HORIZON) == 12.0 and deadline_at(10.0, None, HORIZON) == 40.0
    later_but_tighter, earlier_but_loose = prio(5.0, 1.0), prio(0.0, 10.0)
    assert later_but_tighter < earlier_but_loose
    assert prio(0.0, None) > prio(20.0, 5.0)          # no SLO: due after the default horizon
    # equal deadlines tie; the worker then breaks the tie by arrival (BlockTask.key)
    assert prio(1.0, 2.0) == prio(2.0, 1.0)


def test_a_late_request_yields_to_every_request_that_can_still_make_it_but_keeps_its_order_among_the_late():
    assert is_late(2.0, 12.0, 11.0, hopeless=True) and is_late(2.0, 12.0, 12.5, hopeless=False)
    assert not is_late(2.0, 12.0, 11.0, hopeless=False)
    assert not is_late(None, 40.0, 99.0, hopeless=True)     # without an SLO nothing is missed: arrival order stands
    late = prio(0.0, 1.0, late=True)
    assert late > prio(10.0, 5.0)                      # anyone due within the horizon goes first
    assert prio(0.0, 1.0, late=True) < prio(0.5, 1.0, late=True)
    assert late < prio(late, 1.0)                      # but whatever arrives after its time goes behind it


def test_no_request_waits_unboundedly_behind_a_stream_of_tighter_ones():
    """One server, unit service time, EDF by priority: a stream of 0.5-s-SLO requests arriving faster than it
    serves (overload) never keeps a request without an SLO, a loose one or a late one waiting past its
    priority time (plus the service of what was already ahead of it)."""
    rng = random.Random(7)
    for trial in range(20):
        queue, t, arrivals = [], 0.0, 0
        special = {"no SLO": (None, False), "loose": (20.0, False), "late": (0.5, True)}    # late: as the scheduler
        # marks it, by is_late (a hopeless request with an SLO)
        waiting = {}
        for name, (slo, late) in special.items():
            heapq.heappush(queue, (prio(0.0, slo, late), arrivals, name))
            waiting[name] = prio(0.0, slo, late)
            arrivals += 1
        served_at = {}
        next_arrival = 0.0
        while len(served_at) < len(special) and t < 10_000:     # a starving order would run to the cap
            while next_arrival <= t:                   # 1.5 tight requests per unit of service
                heapq.heappush(queue, (prio(next_arrival, 0.5), arrivals, f"tight{arrivals}"))
                arrivals += 1
                next_arrival += rng.expovariate(1.5)
            _, _, name = heapq.heappop(queue)
            t += 1.0
            if name in special:
                served_at[name] = t
        for name, p in waiting.items():
            # ahead of it: only requests with an earlier priority, all of which arrived before p
            assert served_at[name] <= p + 1.5 * p + 10, (trial, name, served_at[name], p)
