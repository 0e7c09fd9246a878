"""The worker watchdog: notices a worker that owes the front a report and sends none (a forward
that never returns, a wedged device), so the engine can treat it like a dead one.

A worker reports after every loop turn that handled a message or did work, and at least once a
second while it has work (executor/worker_main.py), so a report is owed while messages sent to it are
unhandled or its last report said work remains. Pure bookkeeping fed by the engine with what
it sent and received and the time; it kills nothing itself."""
from __future__ import annotations

from dataclasses import dataclass

from ..messages import LoadReport


@dataclass(slots=True)
class _Track:
    sent: int = 0                       # inbox messages sent to the current process
    handled: int = 0                    # of them, handled as of its latest report
    busy: bool = False                  # its latest report said work remains
    owed_since: float | None = None     # since when a report is owed and none came (None: none owed)


class Watchdog:
    def __init__(self, num_workers: int, timeout_s: float):
        self.timeout_s = timeout_s          # 0: never reports a worker
        self.tracks = [_Track() for _ in range(num_workers)]

    def on_sent(self, wid: int, now: float) -> None:
        t = self.tracks[wid]
        t.sent += 1
        if t.owed_since is None:
            t.owed_since = now

    def on_batch(self, wid: int, batch: list, now: float) -> None:
        """Anything from the worker is progress; its last LoadReport says whether more is owed."""
        t = self.tracks[wid]
        report = next((m for m in reversed(batch) if isinstance(m, LoadReport)), None)
        if report is not None:
            t.handled, t.busy = report.messages_handled, report.busy
        owed = t.busy or t.sent > t.handled
        t.owed_since = now if owed else None

    def reset(self, wid: int) -> None:
        """A new process (or a new slot past the last one): nothing sent to it yet."""
        while len(self.tracks) <= wid:
            self.tracks.append(_Track())
        self.tracks[wid] = _Track()

    def stuck(self, now: float) -> list[int]:
        """Workers that have owed a report for longer than the timeout."""
        if not self.timeout_s:
            return []
        return [wid for wid, t in enumerate(self.tracks)
                if t.owed_since is not None and now - t.owed_since > self.timeout_s]
