"""The server's side of regroups: worker processes as the Reconfigurer's actuator, the planner's period, and
`reconfigure()` on the wall clock."""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Callable

from ..cluster.layout import Layout
from ..cluster.regroup import Reconfigurer, RegroupRecord
from ..config import ServerConfig
from ..executor.watchdog import Watchdog
from ..executor.worker_pool import WorkerPool
from ..scheduler.scheduler import Scheduler

log = logging.getLogger(__name__)


class RegroupAborted(Exception):
    """The server shut down before the regroup finished."""


class RegroupBusy(RuntimeError):
    """Another regroup is running (one at a time)."""


class ServerRegroups:
    """`roles` and `devices` are the pool's own lists (a regroup may add slots to them)."""

    def __init__(self, config: ServerConfig, scheduler: Scheduler, pool: WorkerPool, watchdog: Watchdog,
                 roles: list[str], devices: list, heads: tuple[int, int], layout: Layout):
        self.config, self.pool, self.watchdog, self.roles, self.devices = config, pool, watchdog, roles, devices
        self.heads = heads
        self.device_list = [d for devs in devices for d in devs]
        # one host (mp backend): its devices are one node for stage 2's aligned slots
        self.driver = Reconfigurer(scheduler, self, time.monotonic, layout, heads, len(self.device_list),
                                   on_done=self._done)
        self._done_future: asyncio.Future | None = None
        self._stop_lock = asyncio.Lock()
        self._planner: asyncio.Task | None = None
        self._poller: asyncio.Task | None = None

    @property
    def layout(self) -> Layout:
        return self.driver.layout

    async def reconfigure(self, degrees: list[int], timeout_s: float = 120.0) -> dict:
        if self.config.placement != "colocated" or self.config.distributed_executor_backend != "mp":
            raise ValueError("reconfigure: only colocated placement with the mp backend regroups (disaggregated "
                             "and hybrid hand KV between fixed workers; ray places its bundles at start)")
        if not degrees or sum(degrees) != len(self.device_list):
            raise ValueError(f"reconfigure: degrees {degrees} must add up to the {len(self.device_list)} devices")
        for d in degrees:
            self.config.replace(tensor_parallel_size=d).check_model_heads(*self.heads)
        if self.driver.active is not None:
            raise RegroupBusy("reconfigure: a regroup is already running")
        self.driver.begin(degrees, "asked")
        try:
            record = await asyncio.wait_for(asyncio.shield(self._follow()), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"reconfigure: not done after {timeout_s:g} s; it goes on (GET /reconfigure shows "
                               f"it)") from None
        return record.result

    def _follow(self) -> asyncio.Future:
        """Polls the active regroup until it finishes (one task, whoever waits or stops waiting); its record."""
        done = asyncio.get_running_loop().create_future()
        if self.driver.active is None:           # done inside begin(): nothing to stop or start
            done.set_result(self.driver.records[-1])
            return done
        self._done_future = done

        async def poll() -> None:
            try:
                while self.driver.active is not None and not done.done():
                    self.driver.poll()
                    await asyncio.sleep(0.01)
            except Exception as exc:             # the waiter (an operator, the planner) hears of it
                log.exception("regroup failed")
                if not done.done():
                    done.set_exception(exc)
        self._poller = asyncio.ensure_future(poll())
        return done

    def _done(self, record: RegroupRecord) -> None:
        if self._done_future is not None and not self._done_future.done():
            self._done_future.set_result(record)

    def stop(self, slot: int) -> None:
        async def stop_then_report():
            async with self._stop_lock:          # the pool stops one instance at a time
                await asyncio.get_running_loop().run_in_executor(None, self.pool.retire, slot)
            self.watchdog.reset(slot)
            self.driver.stopped(slot)
        asyncio.ensure_future(stop_then_report())

    def start(self, slot: int, devices: tuple[int, ...]) -> None:
        while len(self.roles) <= slot:
            self.roles.append("colocated")
            self.devices.append(())
        self.devices[slot] = tuple(self.device_list[i] for i in devices)
        self.watchdog.reset(slot)
        started = self.pool.in_spawner(self.pool.start_instance, slot)      # off the loop: it may wait for a restart
        started.add_done_callback(functools.partial(self._started, slot))

    def _started(self, slot: int, started: asyncio.Future) -> None:
        if started.cancelled() or started.exception() is None:
            return
        log.error("regroup: instance %d did not start: %r", slot, started.exception())
        if self._done_future is not None and not self._done_future.done():
            self._done_future.set_exception(started.exception())

    def start_planner(self, serving: Callable[[], bool]) -> None:
        self._planner = asyncio.ensure_future(self._plan(serving))

    def stop_planner(self) -> None:
        for task in (self._planner, self._poller):
            if task is not None:
                task.cancel()
        if self._done_future is not None and not self._done_future.done():
            self._done_future.set_exception(RegroupAborted("reconfigure: the server stopped during the regroup"))

    async def _plan(self, serving: Callable[[], bool]) -> None:
        while True:
            await asyncio.sleep(self.config.reconfigure_period_s)
            if not serving() or self.driver.active is not None:
                continue
            try:
                if self.driver.plan() is not None:
                    await self._follow()
            except Exception:                 # a planner failure must not take the server down
                log.exception("reconfiguration planner failed; the layout stays")
