"""FlashInfer paged attention (CUDA, `--attention-backend flashinfer`): one non-causal batch-prefill call per layer
covers a packed iteration, planned once per forward. `python bench/gpu.py` checks it against SDPA (docs/gpu.md)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import AttentionBatch, LayerKV, SeqSpan, write_fresh_kv


@dataclass(frozen=True, slots=True)
class PagedMetadata:
    """Sequence i: query rows [qo_indptr[i], qo_indptr[i+1]), pages page_ids[kv_indptr[i]: kv_indptr[i+1]]."""
    qo_indptr: list[int]
    kv_indptr: list[int]
    page_ids: list[int]
    last_page_len: list[int]


def paged_metadata(seqs: list[SeqSpan], page_size: int) -> PagedMetadata:
    """Pure: FlashInfer's paged-KV description of a packed batch (pages in canvas order)."""
    qo, kv, pages, last = [0], [0], [], []
    for s in seqs:
        n = -(-s.kv_len // page_size)
        if s.pages is not None:
            pages.extend(s.pages[:n])
        elif s.slot_ids is None:
            first = s.slot_base // page_size
            pages.extend(range(first, first + n))
        else:                                   # reads the device: runner-built spans carry pages
            pages.extend((s.slot_ids[::page_size][:n] // page_size).tolist())
        qo.append(qo[-1] + s.q_len)
        kv.append(len(pages))
        last.append(s.kv_len - (n - 1) * page_size)
    return PagedMetadata(qo, kv, pages, last)


class FlashInferAttention:
    """Callable backend: (q, k, v, layer_kv, batch) -> out, like sdpa_attention."""

    def __init__(self, device: torch.device, page_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, workspace_bytes: int = 256 * 2**20):
        import flashinfer
        self.device, self.page_size, self.dtype = device, page_size, dtype
        self.shape = (num_heads, num_kv_heads, head_dim)
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=device)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self._planned: AttentionBatch | None = None   # held, not its id(): ids of dead objects recur

    def _plan(self, batch: AttentionBatch) -> None:
        m = paged_metadata(batch.seqs, self.page_size)
        host = lambda x: torch.tensor(x, dtype=torch.int32)   # noqa: E731
        h, hkv, d = self.shape
        # Indptrs stay on the host: the planner schedules from them without a device read (as vLLM does).
        self.wrapper.plan(host(m.qo_indptr), host(m.kv_indptr), host(m.page_ids).to(self.device),
                          host(m.last_page_len), h, hkv, d, self.page_size, causal=batch.causal,
                          q_data_type=self.dtype, kv_data_type=self.dtype)
        self._planned = batch

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: LayerKV,
                 batch: AttentionBatch) -> torch.Tensor:
        if self._planned is not batch:
            self._plan(batch)
        write_fresh_kv(kv, batch, k, v)
        _, hkv, d = self.shape
        pages = (kv.k.view(-1, self.page_size, hkv, d), kv.v.view(-1, self.page_size, hkv, d))
        return self.wrapper.run(q.contiguous(), pages)   # fused QKV: q is a strided view
