"""Paged KV storage of one worker: per-layer K/V tensors and the page allocator (it decides nothing about who
gets pages). A contiguous run is preferred: attention then reads a plain view, no gather."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.attention import LayerKV


@dataclass(slots=True)
class PageAlloc:
    pages: list[int]
    slot_base: int                   # >= 0 when the pages form one contiguous run
    slot_ids: torch.Tensor | None    # otherwise the slot of every canvas position
    shared: int = 0                  # leading pages borrowed from the prefix cache, never freed with it


def alloc_of_pages(pages: list[int], num_tokens: int, page_size: int, device: torch.device | str) -> PageAlloc:
    """The allocation of `num_tokens` canvas positions on `pages`, in canvas order."""
    if pages == list(range(pages[0], pages[0] + len(pages))):
        return PageAlloc(pages, pages[0] * page_size, None)
    idx = torch.arange(num_tokens)
    page_of = torch.tensor(pages, dtype=torch.int64)[idx // page_size]
    # On the pool's device: index_select on CUDA rejects a host index.
    return PageAlloc(pages, -1, (page_of * page_size + idx % page_size).to(device))


class KVPool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = torch.device(device)
        # never allocated: the target of fixed-shape (CUDA graph) batches' padding
        self.scratch_page = num_pages
        slots = (num_pages + 1) * page_size
        self.layers = [LayerKV(torch.zeros(slots, num_kv_heads, head_dim, dtype=dtype, device=device),
                               torch.zeros(slots, num_kv_heads, head_dim, dtype=dtype, device=device))
                       for _ in range(num_layers)]
        self._is_free = bytearray(b"\x01") * num_pages    # 1 = free; bytes.find scans it in C
        self.num_free_pages = num_pages
        self._owner: dict[str, PageAlloc] = {}
        self._cached: set[int] = set()
        self.cache = None

    def pages_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    @property
    def num_available_pages(self) -> int:
        """Free pages plus the cached ones nobody references (reclaimed on demand)."""
        return self.num_free_pages + (self.cache.num_idle_pages if self.cache is not None else 0)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.pages_needed(num_tokens) <= self.num_available_pages

    def allocate(self, owner: str, num_tokens: int, shared: list[int] = ()) -> PageAlloc:
        """Pages for `num_tokens` positions under `owner`, starting with `shared` (cached, referenced by the caller)."""
        n = self.pages_needed(num_tokens) - len(shared)
        if owner in self._owner:
            raise RuntimeError(f"KV pages already allocated for {owner}")
        if n > self.num_free_pages and self.cache is not None:
            self.cache.evict(n - self.num_free_pages)
        if n > self.num_free_pages:
            raise RuntimeError(f"out of KV pages: need {n}, {self.num_free_pages} free")
        own = (not shared and self._contiguous_run(n)) or [i for i, free in enumerate(self._is_free) if free][:n]
        for p in own:
            self._is_free[p] = 0
        self.num_free_pages -= n
        alloc = alloc_of_pages(list(shared) + own, num_tokens, self.page_size, self.device)
        alloc.shared = len(shared)
        self._owner[owner] = alloc
        return alloc

    def free(self, owner: str) -> None:
        alloc = self._owner.pop(owner, None)
        if alloc is None:
            return
        for p in alloc.pages[alloc.shared:]:
            if p not in self._cached:            # the prefix cache frees them later
                self._is_free[p] = 1
                self.num_free_pages += 1

    def share(self, pages) -> None:
        """The prefix cache keeps these pages (their owner's free() leaves them allocated)."""
        self._cached.update(pages)

    def unshare(self, pages) -> None:
        for p in pages:
            self._cached.remove(p)
            self._is_free[p] = 1
        self.num_free_pages += len(pages)

    def rename(self, owner: str, new_owner: str) -> PageAlloc | None:
        """Hand an allocation to a new owner key; None when `owner` holds nothing."""
        if new_owner in self._owner:
            raise RuntimeError(f"KV pages already allocated for {new_owner}")
        alloc = self._owner.pop(owner, None)
        if alloc is not None:
            self._owner[new_owner] = alloc
        return alloc

    def owners(self) -> list[str]:
        return list(self._owner)

    def check_integrity(self) -> None:
        own = [p for a in self._owner.values() for p in a.pages[a.shared:]]
        if len(own) != len(set(own)):
            raise AssertionError("a KV page has two owners")
        if any(p not in self._cached for a in self._owner.values() for p in a.pages[:a.shared]):
            raise AssertionError("a shared KV page is not in the prefix cache")
        used = set(own) | self._cached
        if any(self._is_free[p] for p in used):
            raise AssertionError("an owned or cached KV page is marked free")
        if self.num_free_pages != sum(self._is_free) or self.num_free_pages + len(used) != self.num_pages:
            raise AssertionError("KV free-page count is inconsistent")

    def _contiguous_run(self, n: int) -> list[int] | None:
        i = self._is_free.find(b"\x01" * n)
        return list(range(i, i + n)) if i >= 0 else None
