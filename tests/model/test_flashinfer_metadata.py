"""The FlashInfer plan's page tables, built from the same spans the SDPA backend reads (the
kernel itself needs a GPU; bench/gpu.py compares it with SDPA there)."""
import pytest
import torch

from dllm_server.model.attention import SeqSpan
from dllm_server.model.backends import select_backend
from dllm_server.model.flashinfer_backend import paged_metadata
from dllm_server.worker.kv_pool import KVPool


def test_page_tables_follow_each_canvas_in_order():
    pool = KVPool(1, 16, 4, 1, 2, torch.float32)
    pool.allocate("a", 8), pool.allocate("b", 4), pool.free("a")      # fragment: pages 0,1 free
    c = pool.allocate("c", 10)     # needs 3 pages: no run of 3 at the front -> contiguous 3..5
    pool.allocate("fill", 40)      # take the rest except pages 0,1
    pool.free("b")
    d = pool.allocate("d", 11)     # pages 0,1,2: contiguous again
    seqs = [SeqSpan(0, 5, 5, 10, c.slot_base, c.slot_ids), SeqSpan(5, 11, 0, 11, d.slot_base, d.slot_ids)]
    m = paged_metadata(seqs, 4)
    assert m.qo_indptr == [0, 5, 16]
    assert m.kv_indptr == [0, 3, 6]
    assert m.page_ids[:3] == c.pages and m.page_ids[3:] == d.pages
    assert m.last_page_len == [2, 3]


def test_gathered_pages_come_from_slot_ids():
    slot_ids = torch.tensor([p * 4 + i for p in (7, 2, 9) for i in range(4)])[:10]
    m = paged_metadata([SeqSpan(0, 2, 8, 10, -1, slot_ids)], 4)
    assert m.page_ids == [7, 2, 9] and m.last_page_len == [2]


def test_backend_selection(caplog):
    assert select_backend("sdpa", torch.device("cpu")).__name__ == "sdpa_attention"
    # flashinfer where it cannot run (no CUDA here): SDPA, and the log says so
    assert select_backend("flashinfer", torch.device("cpu")).__name__ == "sdpa_attention"
    assert "using SDPA" in caplog.text
    with pytest.raises(ValueError, match="attention_backend"):
        select_backend("magic", torch.device("cpu"))


def test_host_page_lists_agree_with_slot_ids():
    """Runner-built spans carry the host page list (no device read); it gives the same table."""
    pool = KVPool(1, 12, 4, 1, 2, torch.float32)
    for p in range(12):
        pool.allocate(f"p{p}", 4)
    for p in (9, 2, 5, 7):
        pool.free(f"p{p}")
    g = pool.allocate("g", 14)
    assert g.slot_ids is not None
    from_ids = paged_metadata([SeqSpan(0, 4, 10, 14, -1, g.slot_ids)], 4)
    from_host = paged_metadata([SeqSpan(0, 4, 10, 14, -1, g.slot_ids, g.pages)], 4)
    assert from_ids == from_host and from_host.page_ids == g.pages
