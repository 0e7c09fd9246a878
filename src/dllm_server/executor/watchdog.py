"""Finds workers that owe a report and send none (a hung forward, a wedged device). Pure bookkeeping: a report
is owed while sent messages are unhandled or the last report said work remains; it kills nothing."""
from __future__ import annotations

from dataclasses import dataclass

from ..messages import LoadReport


@dataclass(slots=True)
class _Track:
    sent: int = 0
    handled: int = 0
    busy: bool = False
    owed_since: float | None = None     # None: no report owed


class Watchdog:
    def __init__(self, num_workers: int, timeout_s: float):
        self.timeout_s = timeout_s          # 0: off
        self.tracks = [_Track() for _ in range(num_workers)]

    def on_sent(self, wid: int, now: float) -> None:
        t = self.tracks[wid]
        t.sent += 1
        if t.owed_since is None:
            t.owed_since = now

    def on_batch(self, wid: int, batch: list, now: float) -> None:
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
        if not self.timeout_s:
            return []
        return [wid for wid, t in enumerate(self.tracks)
                if t.owed_since is not None and now - t.owed_since > self.timeout_s]
