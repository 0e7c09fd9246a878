"""A regex as a token automaton (outlines-core builds it over the served vocabulary), and the dynamic program
that picks, for one block of the canvas, the most probable assignment of its masked positions that keeps the
whole answer completable (DINGO, arXiv 2505.23061). Any subset of that assignment may then be committed: the
rest of it still completes the answer, so the canvas never becomes unsatisfiable."""
from __future__ import annotations

import functools
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

NO_PATH = -1
UNREACHABLE = 1 << 30           # the distance of a state from which no answer can be completed


class TokenAutomaton:
    """Dense states 0..S-1 (0 initial) plus DONE = S: the answer ended (a stop token after an accepting state);
    from DONE any token follows, and a truncated canvas needs nothing after it."""

    def __init__(self, regex: str, vocab: dict[bytes, list[int]], stop_ids: tuple[int, ...], vocab_size: int):
        from outlines_core import Index, Vocabulary
        if not stop_ids:
            raise ValueError("structured output needs an end-of-answer token")
        marker = stop_ids[0]            # outlines' own EOS edges are dropped: stops are handled here
        self._index = index = Index(regex, Vocabulary(marker, vocab))
        raw = index.get_transitions()
        init, finals = index.get_initial_state(), set(index.get_final_states())
        self._raw = [init] + sorted((set(raw) | finals) - {init})       # dense id -> outlines' state id
        self._dense = {r: i for i, r in enumerate(self._raw)}
        self.num_states = len(self._raw)
        self.done = self.num_states
        keys = np.array(self._raw, dtype=np.int64)
        by_key = np.argsort(keys)
        dense = lambda r: by_key[np.searchsorted(keys, r, sorter=by_key)]   # noqa: E731
        parts = [(np.full(len(e), s, dtype=np.int64), np.fromiter(e.keys(), np.int64, len(e)),
                  np.fromiter(e.values(), np.int64, len(e))) for s, e in raw.items() if e]
        src, tok, dst = (np.concatenate(x) for x in zip(*parts)) if parts else (np.zeros(0, dtype=np.int64),) * 3
        final_raw = np.array(sorted(finals), dtype=np.int64)
        keep = ~((tok == marker) & (src == dst) & np.isin(src, final_raw))   # EOS loops: stops are ours
        src, tok, dst = dense(src[keep]), tok[keep], dense(dst[keep])
        self.final = torch.zeros(self.num_states, dtype=torch.bool)
        self.final[[self._dense[r] for r in finals]] = True
        self._final = self.final.tolist()
        self.src, self.tok, self.dst = (torch.from_numpy(np.ascontiguousarray(x)).to(torch.int64)
                                        for x in (src, tok, dst))
        self.stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.int64)
        self.stop_set = frozenset(stop_ids)
        self.marker = marker
        self.vocab_size = vocab_size
        self.dist = self._distance_to_final()
        self._on: dict[torch.device, tuple] = {}

    @property
    def num_transitions(self) -> int:
        return self.src.numel()

    def _distance_to_final(self) -> list[int]:
        """Fewest tokens from each state to an accepting one (a large number when none is reachable)."""
        inf = UNREACHABLE
        dist = [0 if f else inf for f in self._final]
        n_key = self.num_states
        pairs = np.unique(self.src.numpy() * n_key + self.dst.numpy())      # 1-D: far faster than axis=1
        back: list[list[int]] = [[] for _ in range(self.num_states)]
        for s, n in zip((pairs // n_key).tolist(), (pairs % n_key).tolist()):
            back[n].append(s)
        frontier = [s for s, d in enumerate(dist) if d == 0]
        while frontier:
            nxt = []
            for n in frontier:
                for s in back[n]:
                    if dist[s] == inf:
                        dist[s] = dist[n] + 1
                        nxt.append(s)
            frontier = nxt
        return dist

    def allowed(self, state: int) -> set[int]:
        """The tokens that continue the answer from `state` (not the stops that end it)."""
        return set(self._index.get_allowed_tokens(self._raw[state]) or ()) - {self.marker}

    @property
    def min_tokens(self) -> int:
        """The shortest allowed answer, in tokens."""
        return self.dist[0]

    def walk(self, state: int, tokens) -> int:
        """The state after `tokens` (NO_PATH when they leave the language)."""
        for t in tokens:
            if state == self.done or state == NO_PATH:
                return state
            if t in self.stop_set and self._final[state]:
                state = self.done
            elif t == self.marker:
                return NO_PATH
            else:
                r = self._index.get_next_state(self._raw[state], t)
                state = NO_PATH if r is None else self._dense[r]
        return state

    def _token_classes(self) -> tuple:
        """Tokens that move every state alike form one class, so a step's dynamic program runs over classes (a
        few hundred) instead of tokens (all a string state admits). Edges include DONE's: from each accepting
        state through each stop token, and from DONE through every token."""
        fin = self.final.nonzero().flatten()
        n_stop, every = self.stops.numel(), torch.arange(self.vocab_size, dtype=torch.int64)
        src = torch.cat((self.src, fin.repeat_interleave(n_stop), torch.full_like(every, self.done))).numpy()
        tok = torch.cat((self.tok, self.stops.repeat(fin.numel()), every)).numpy()
        dst = torch.cat((self.dst, torch.full((fin.numel() * n_stop,), self.done, dtype=torch.int64),
                         torch.full_like(every, self.done))).numpy()
        # a token's signature: the XOR of a 64-bit mix of each of its (src, dst) edges
        x = (src.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ (dst.astype(np.uint64) + np.uint64(0x632BE5AB))
        x ^= x >> np.uint64(29)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(32)
        sig = np.zeros(self.vocab_size, dtype=np.uint64)
        np.bitwise_xor.at(sig, tok, x)
        _, rep, cls = np.unique(sig, return_index=True, return_inverse=True)
        keep = rep[cls[tok]] == tok                 # each class's edges, read off its first token
        n, c = self.num_states + 1, int(cls.max()) + 1
        key = np.unique((src[keep] * c + cls[tok[keep]]) * n + dst[keep])
        edges = (key // n // c, key // n % c, key % n)
        return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(torch.int64) for a in (*edges, cls))

    def tensors(self, device: torch.device) -> tuple:
        """(edge src, edge class, edge dst, class of each token, accepting incl. DONE, distance) on `device`."""
        if device not in self._on:
            final = torch.cat((self.final, torch.ones(1, dtype=torch.bool)))
            dist = torch.tensor(self.dist + [0], dtype=torch.int64)
            self._on[device] = tuple(x.to(device) for x in (*self._classes, final, dist))
        return self._on[device]

    @functools.cached_property
    def _classes(self) -> tuple:
        return self._token_classes()

    @property
    def num_classes(self) -> int:
        return int(self._classes[3].max()) + 1

    def best_assignment(self, scores: torch.Tensor, fixed: list[int | None], start: int, first: int, cut: int | None,
                        budget: int) -> torch.Tensor | None:
        """scores [K, V] (log-probabilities, or perturbed ones to sample); fixed[j] a position's committed token
        (None: masked); the DFA state `start` before position `first` (earlier positions are not answer).
        The answer must be complete at position `cut` when the visible answer ends in the block, else within
        `budget` further tokens. Returns host int64 [K] (positions before `first` keep -1), or None: no path."""
        k = scores.shape[0]
        out = torch.full((k,), -1, dtype=torch.int64)
        stop_at = k if cut is None else min(cut, k)
        if start == NO_PATH:
            return None
        if start == self.done or stop_at <= first:
            out[first:] = scores[first:].argmax(dim=-1).cpu()
            return out if start == self.done or (cut is not None and self._final[start]) else None
        src, ecls, dst, cls, final, dist = self.tensors(scores.device)
        n, e_n, c_n, dev, ninf = self.num_states + 1, src.numel(), self.num_classes, scores.device, float("-inf")
        sc = scores[first:stop_at, : self.vocab_size]
        rows = sc.shape[0]
        pinned = [(j - first, t) for j, t in enumerate(fixed[:stop_at]) if j >= first and t is not None]
        if pinned:                      # a committed position allows its own token only
            r_i = torch.tensor([j for j, _ in pinned], device=dev)
            t_i = torch.tensor([t for _, t in pinned], device=dev)
            keep = sc[r_i, t_i].clamp(min=-1e300)
            sc = sc.clone()
            sc[r_i] = ninf
            sc[r_i, t_i] = keep
        # each class's best token per position: the program then runs over class edges only
        idx = cls.expand(rows, -1)
        cbest = torch.full((rows, c_n), ninf, dtype=sc.dtype, device=dev).scatter_reduce(1, idx, sc, "amax")
        who = torch.where(sc == cbest.gather(1, idx), torch.arange(sc.shape[1], device=dev), sc.shape[1])
        ctok = torch.full((rows, c_n), sc.shape[1], dtype=torch.int64, device=dev).scatter_reduce(1, idx, who, "amin")
        edge_sc = cbest[:, ecls]                                    # [rows, E]
        v = torch.full((n,), ninf, dtype=torch.float64, device=dev)
        v[start] = 0.0
        index = torch.arange(e_n, device=dev)
        back = []
        for r in range(rows):
            cand = v[src] + edge_sc[r]
            v = torch.full((n,), ninf, dtype=torch.float64, device=dev).scatter_reduce(0, dst, cand, "amax")
            best = torch.where((cand == v[dst]) & (cand > ninf), index, e_n)
            back.append(torch.full((n,), e_n, dtype=torch.int64, device=dev).scatter_reduce(0, dst, best, "amin"))
        ok = final if cut is not None and cut <= k else (dist <= budget)
        end = torch.where(ok, v, torch.full_like(v, ninf)).argmax()
        tail = scores[stop_at:].argmax(dim=-1)          # past the visible answer: free, and cut
        flat = torch.cat((torch.stack(back).flatten(), ctok.flatten(), tail, end.view(1))).cpu()   # one host copy
        back_h, ctok_h = flat[: rows * n].view(rows, n), flat[rows * n: rows * (n + c_n)].view(rows, c_n)
        s = int(flat[-1])
        if back_h[-1, s] == e_n:
            return None
        src_h, cls_h = self._edge_lists
        for r in range(rows - 1, -1, -1):
            e = int(back_h[r, s])
            out[first + r] = ctok_h[r, cls_h[e]]
            s = src_h[e]
        out[stop_at:] = flat[rows * (n + c_n): -1]
        return out

    @functools.cached_property
    def _edge_lists(self) -> tuple[list[int], list[int]]:
        return self._classes[0].tolist(), self._classes[1].tolist()


class AutomatonCache:
    """Compiled automata by regex, least recently used dropped (compiling is the expensive part)."""

    def __init__(self, vocab: dict[bytes, list[int]], stop_ids: tuple[int, ...], vocab_size: int,
                 capacity: int = 16):
        self.vocab, self.stop_ids, self.vocab_size = vocab, tuple(stop_ids), vocab_size
        self.capacity = capacity
        self._items: OrderedDict[str, TokenAutomaton] = OrderedDict()

    def get(self, regex: str) -> TokenAutomaton:
        a = self._items.get(regex)
        if a is None:
            a = TokenAutomaton(regex, self.vocab, self.stop_ids, self.vocab_size)
            self._items[regex] = a
            if len(self._items) > self.capacity:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(regex)
        return a


@dataclass(slots=True)
class RowConstraint:
    """One block's constraint in a step (decoding/commit.py calls `choose`)."""
    automaton: TokenAutomaton
    start: int                   # the state before the block's first answer position
    first: int                   # block positions before this are prompt (a block-causal first block)
    cut: int | None              # block position where the visible answer ends, if inside the block
    budget: int                  # answer tokens allowed after the block
    block: list[int]             # the block's tokens now (the mask id where open)
    mask_id: int
    elapsed_ms: float = 0.0      # what `choose` took

    def choose(self, scores: torch.Tensor) -> torch.Tensor | None:
        t0 = time.perf_counter()
        fixed = [None if t == self.mask_id else t for t in self.block]
        out = self.automaton.best_assignment(scores, fixed, self.start, self.first, self.cut, self.budget)
        self.elapsed_ms = 1e3 * (time.perf_counter() - t0)
        return out
