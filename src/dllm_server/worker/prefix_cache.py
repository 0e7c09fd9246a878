"""The prefix cache of block-causal families (SDAR): committed prompt KV shared across requests.

A block-causal model's KV at a position depends on the tokens up to the end of its block only,
never on the answer, so prompt KV computed once serves every later request whose tokens agree up
to there, exactly (LLaDA / Dream: no cache, their prompt KV depends on the answer). The unit is a
run of whole pages that ends on a block boundary too (lcm of page and block size), keyed by a hash
chain over the token ids up to its end; only units wholly inside the prompt's complete blocks are
cached (the first answer block, which holds the prompt's tail, never is). A hit is the longest
chain of hits from position 0. Cached pages are read-only and counted by reference; a request that
ends donates its own prompt units whose key is new; units nobody references stay cached until the
pool runs short, then go least recently used first (KVPool.reclaim).
"""
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
        self.pages_of: dict[bytes, tuple[int, ...]] = {}     # key -> its unit's pages
        self.refs: collections.Counter = collections.Counter()  # key -> requests using it
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
        """Pages of the longest cached chain from the start, in canvas order; each unit is now
        referenced once more (release() gives the references back)."""
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
        """A request ends: its references to the first `num_hits` units go; given its canvas pages
        (`pages`, None when its KV was never written), its own units past the hits join the cache
        where their key is new (KVPool.share keeps those pages from being freed with it)."""
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
        """Free at least `needed_pages` pages from unreferenced units, least recently used first,
        or all of them; returns the pages freed."""
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
