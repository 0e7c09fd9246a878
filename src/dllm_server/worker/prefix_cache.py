"""The prefix cache of block-causal families (docs/block_causal.md): committed prompt KV shared across requests.
A unit is a run of whole pages ending on a block boundary, keyed by a hash chain over the tokens up to its end;
cached pages are read-only and counted by reference, and unreferenced ones go least recently used first."""
from __future__ import annotations

import collections
import hashlib
import math

import torch

from .kv_pool import KVPool


class PrefixCache:
    def __init__(self, pool: KVPool, block_size: int):
        self.pool = pool
        self.unit_pages = math.lcm(pool.page_size, block_size) // pool.page_size
        self.unit_tokens = self.unit_pages * pool.page_size
        self.pages_of: dict[bytes, tuple[int, ...]] = {}
        self.refs: collections.Counter = collections.Counter()
        self.idle: collections.OrderedDict[bytes, None] = collections.OrderedDict()   # unreferenced, oldest first
        self.hit_tokens = self.query_tokens = self.evicted_pages = 0
        pool.cache = self

    def keys(self, canvas: torch.Tensor, cacheable_len: int) -> list[bytes]:
        """The hash chain of the whole units in canvas[:cacheable_len]."""
        out, h, u = [], b"", self.unit_tokens
        data = canvas[: (cacheable_len // u) * u].numpy()
        for i in range(0, len(data), u):
            h = hashlib.blake2b(h + data[i:i + u].tobytes(), digest_size=16).digest()
            out.append(h)
        return out

    def peek(self, keys: list[bytes]) -> int:
        """Units of the longest cached chain from the start (nothing referenced)."""
        n = 0
        while n < len(keys) and keys[n] in self.pages_of:
            n += 1
        return n

    def lookup(self, keys: list[bytes]) -> list[int]:
        """Pages of the longest cached chain from the start; each unit gains a reference until release()."""
        n = self.peek(keys)
        pages: list[int] = []
        for k in keys[:n]:
            pages.extend(self.pages_of[k])
            self.refs[k] += 1
            self.idle.pop(k, None)
        self.query_tokens += len(keys) * self.unit_tokens
        self.hit_tokens += n * self.unit_tokens
        return pages

    def release(self, keys: list[bytes], num_hits: int, pages: list[int] | None) -> None:
        """A request ends: its references to the first `num_hits` units go, and its own units past them join the
        cache where their key is new (`pages`: its canvas pages, None when its KV was never written)."""
        for k in keys[:num_hits]:
            self.refs[k] -= 1
            if self.refs[k] <= 0:
                del self.refs[k]
                self.idle[k] = None
        if pages is None:
            return
        up = self.unit_pages
        for j in range(num_hits, len(keys)):
            k = keys[j]
            if k in self.pages_of:
                continue                  # another request's copy is cached already: ours is freed
            unit = tuple(pages[j * up:(j + 1) * up])
            self.pages_of[k] = unit
            self.pool.share(unit)
            self.idle[k] = None

    def evict(self, needed_pages: int) -> int:
        """Free at least `needed_pages` pages (or all) from unreferenced units, LRU first; returns the count."""
        freed: list[int] = []
        while self.idle and len(freed) < needed_pages:
            k, _ = self.idle.popitem(last=False)
            freed.extend(self.pages_of.pop(k))
        if freed:
            self.pool.unshare(freed)
            self.evicted_pages += len(freed)
        return len(freed)

    @property
    def num_idle_pages(self) -> int:
        return len(self.idle) * self.unit_pages

    @property
    def num_cached_pages(self) -> int:
        return len(self.pages_of) * self.unit_pages
