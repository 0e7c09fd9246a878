"""Training batches built ahead in worker processes (scripts/train_demo.py --data-workers N), for an
accelerator that finishes a step faster than one CPU core draws, tokenizes and pads its rows.

Each worker is forked with the parent's `Rows` and `TaskRows` (the tokenized corpus is shared
copy-on-write, nothing is rebuilt) and re-seeds their RNGs from (seed, worker, start step), so the
workers draw different rows and a resumed run draws new ones. Batches are pinned for an
asynchronous copy to the device. The in-process path (no workers) keeps the single RNG stream that
train_state.pt saves and restores; this one trades that exact replay for throughput.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

Groups = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]   # (rows, maskable, loss denominators)


class StepBatches(IterableDataset):
    def __init__(self, make_groups: Callable[[], Groups], rngs: list, seed: int, start_step: int):
        super().__init__()
        self.make_groups, self.rngs, self.seed, self.start_step = make_groups, rngs, seed, start_step

    def __iter__(self) -> Iterator[Groups]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        for k, rng in enumerate(self.rngs):
            rng.seed(((self.seed * 1_000_003 + self.start_step) * 101 + worker) * 7 + k)
        while True:
            yield self.make_groups()


def prefetched(make_groups: Callable[[], Groups], rngs: list, seed: int, start_step: int,
               workers: int) -> Iterator[Groups]:
    loader = DataLoader(StepBatches(make_groups, rngs, seed, start_step), batch_size=None,
                        num_workers=workers, pin_memory=torch.cuda.is_available(), prefetch_factor=4,
                        persistent_workers=True)
    return iter(loader)
