"""Compiled constraints of one served checkpoint. The front checks a request's constraint before admitting it
(`check`: the regex, the automaton, the shortest answer against max_tokens), in a child process with a time
limit so that a schema whose automaton explodes costs a 400, not the front; workers compile the regex the
front accepted (`automaton`, cached) and build each constrained row of a step (`row`)."""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
from collections import OrderedDict

from ..decoding.params import DecodeParams, SamplingParams, StructuredOutputs
from .automaton import NO_PATH, UNREACHABLE, AutomatonCache, RowConstraint, TokenAutomaton
from .schema import regex_for
from .vocab import vocab_of


def _compile_stats(regex: str, folder: str, stop_ids: tuple[int, ...], vocab_size: int, conn) -> None:
    try:
        conn.send(("ok", TokenAutomaton(regex, vocab_of(folder), stop_ids, vocab_size).min_tokens))
    except Exception as e:                 # the compiler's refusal, sent back as text
        conn.send(("error", str(e)))
    finally:
        conn.close()


class Grammars:
    def __init__(self, folder: str, stop_ids: tuple[int, ...], vocab_size: int, timeout_s: float | None = None):
        """`timeout_s`: check in a child process with this limit (the server's front); None: in this process."""
        self.folder, self.stop_ids, self.vocab_size = str(folder), tuple(sorted(stop_ids)), vocab_size
        self.timeout_s = timeout_s
        self._checked: OrderedDict[str, tuple[str, int]] = OrderedDict()   # spec key -> (regex, min tokens)
        self._automata: AutomatonCache | None = None

    def automaton(self, regex: str) -> TokenAutomaton:
        if self._automata is None:
            self._automata = AutomatonCache(vocab_of(self.folder), self.stop_ids, self.vocab_size)
        return self._automata.get(regex)

    def check(self, spec: StructuredOutputs, max_tokens: int) -> str:
        """The regex the answer must match; ValueError naming the field when it cannot be served."""
        hit = self._checked.get(spec.key)
        if hit is not None:
            self._checked.move_to_end(spec.key)
        else:
            regex = regex_for(spec)
            min_tokens = self._min_tokens(regex, spec.field)
            hit = self._checked[spec.key] = (regex, min_tokens)
            if len(self._checked) > 256:
                self._checked.popitem(last=False)
        regex, min_tokens = hit
        if min_tokens >= UNREACHABLE:
            raise ValueError(f"{spec.field}: no answer satisfies it (its automaton has no accepting path)")
        if min_tokens > max_tokens:
            raise ValueError(f"max_tokens: {max_tokens} is too small for any answer satisfying {spec.field} "
                             f"(the shortest takes {min_tokens} tokens)")
        return regex

    def is_checked(self, spec: StructuredOutputs) -> bool:
        return spec.key in self._checked

    def constrain(self, params: SamplingParams, resolved: DecodeParams) -> DecodeParams:
        """`resolved` with the regex its request's structured_outputs compiles to (unchanged without one)."""
        if params.structured_outputs is None:
            return resolved
        return dataclasses.replace(resolved, constraint=self.check(params.structured_outputs, params.max_tokens))

    def _min_tokens(self, regex: str, field: str) -> int:
        if self.timeout_s is None:
            try:
                return self.automaton(regex).min_tokens
            except ValueError:
                raise
            except Exception as e:
                raise ValueError(f"{field}: cannot be compiled: {e}") from None
        ctx = mp.get_context("forkserver")      # children forked from a clean process that imported us once
        ctx.set_forkserver_preload([__name__])
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_compile_stats, args=(regex, self.folder, self.stop_ids, self.vocab_size, send),
                        daemon=True)
        p.start()
        send.close()
        try:
            if not recv.poll(self.timeout_s):
                raise ValueError(f"{field}: compiling it took longer than {self.timeout_s:g} s (too complex)")
            reply = recv.recv()
        except EOFError:
            raise ValueError(f"{field}: compiling it failed (the compiler exited)") from None
        finally:
            if p.is_alive():
                p.kill()
            p.join()
            recv.close()
        if reply[0] == "error":
            raise ValueError(f"{field}: cannot be compiled: {reply[1]}")
        return reply[1]

    def row(self, regex: str, answer: list[int], prompt_len: int, start: int, end: int, max_tokens: int,
            block: list[int], mask_id: int, cached: tuple | None, block_index: int
            ) -> tuple[RowConstraint | None, tuple]:
        """The step's constraint for one block (None: its answer has already left the language), and what the
        block keeps for its next steps: (automaton, block index, state at the block's start)."""
        if cached is not None and cached[1] == block_index:
            a, _, state = cached
        else:
            a = cached[0] if cached is not None else self.automaton(regex)
            state = a.walk(0, answer[:max(0, start - prompt_len)])
        if state == NO_PATH:
            return None, (a, block_index, state)
        first = max(0, prompt_len - start)
        visible_end = prompt_len + max_tokens
        cut = visible_end - start if visible_end < end else None
        return RowConstraint(a, state, first, cut, max(0, visible_end - end), block, mask_id), (a, block_index, state)
