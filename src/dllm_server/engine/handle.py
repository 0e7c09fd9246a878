"""What a caller of AsyncEngine holds of one submitted request."""
from __future__ import annotations

from ..scheduler.request_table import Entry


class RequestHandle:
    """A submitted request's identity, timings and abort; its events come from AsyncEngine.generate(handle)."""

    def __init__(self, entry: Entry, abort):
        self._entry = entry
        self._abort = abort

    @property
    def request_id(self) -> str:
        return self._entry.state.request_id

    @property
    def prompt_len(self) -> int:
        return self._entry.state.prompt_len

    @property
    def answer_len(self) -> int:
        """Answer positions on the canvas: up to the end of the block holding the last one."""
        return self._entry.state.answer_len

    @property
    def block_length(self) -> int:
        return self._entry.state.params.block_length

    @property
    def block_offset(self) -> int:
        """Prompt positions in the first answer block (block-causal grids start at position 0; else 0)."""
        p = self._entry.state.params
        return self.prompt_len % p.block_length if p.block_causal else 0

    @property
    def arrived_at(self) -> float:
        return self._entry.arrived_at

    @property
    def first_step_at(self) -> float | None:
        return self._entry.first_step_at

    @property
    def first_token_at(self) -> float | None:
        return self._entry.first_token_at

    @property
    def finished(self) -> bool:
        return self._entry.done

    def abort(self) -> None:
        self._abort(self.request_id)
