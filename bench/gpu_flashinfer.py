"""The FlashInfer phase of bench/gpu.py, in a child process with a deadline (the first use may JIT-compile
kernels for minutes, and a CUDA fault must not poison the parent): the raw kernel, then our backend."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from bench.gpu_parts import Shapes, build_model, canvas, compare, median, time_ms
from dllm_server.model.attention import AttentionBatch, PaddedBatch, SeqSpan, padded_attention, sdpa_attention
from dllm_server.worker.cuda_graph import padded_metadata
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner, fed_range

ROOT = Path(__file__).resolve().parents[1]      # the child runs `python -m bench.gpu` from here


def unavailable(device) -> str | None:
    """Why the phase cannot run, found without a child (which spends seconds importing torch)."""
    if torch.device(device).type != "cuda":
        return f"no CUDA device (device={torch.device(device).type})"
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer not installed (pip install flashinfer-python matching torch / CUDA)"
    return None


def run_child(module: str, out: Path, device, dtype, seed: int, smoke: bool, layers: int | None,
              limit_s: float) -> dict:
    """`python -m <module> --flashinfer-only` (bench.gpu) from the repository root, its JSON read back."""
    reason = unavailable(device)
    if reason:
        print(f"FlashInfer check skipped: {reason}")
        return {"skipped": reason}
    tmp = out.resolve().with_name(out.name + ".flashinfer.json")
    tmp.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", module, "--flashinfer-only", "--out", str(tmp), "--device", str(device),
           "--seed", str(seed), "--dtype", str(dtype).removeprefix("torch.")]
    cmd += (["--smoke"] if smoke else []) + (["--layers", str(layers)] if layers else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            cwd=ROOT)
    try:
        log = proc.communicate(timeout=limit_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # its group: the child and any compiler it started
        proc.communicate()
        r = {"skipped": f"timed out after {limit_s:.0f} s (the first use JIT-compiles FlashInfer kernels; "
                        "install the matching flashinfer-jit-cache / flashinfer-cubin, or rerun)"}
    else:
        if proc.returncode == 0 and tmp.is_file():
            r = json.loads(tmp.read_text())
        else:
            r = {"error": f"child exited {proc.returncode}: {log[-1500:]}", "ok": False}
    tmp.unlink(missing_ok=True)
    if "skipped" in r:
        print(f"FlashInfer check skipped: {r['skipped']}")
    elif "error" in r:
        print(f"FlashInfer check FAILED: {r['error']}")
    else:
        d, e = r["decode_shape_one_layer"], r["backend"]
        print(f"FlashInfer {r['version']} paged prefill (non-causal) vs SDPA: max abs err {r['max_abs_err']:.2e} "
              f"({'OK' if r['ok_kernel'] else 'FAIL'}, {r['gathered_seqs']} gathered-page sequences); one layer at "
              f"batch {d['batch']} x {d['q_len']} q / {d['kv_len']} kv: SDPA loop {d['sdpa_loop_ms']:.2f} ms, "
              f"padded SDPA (graph path) {d['padded_sdpa_ms']:.2f} ms, FlashInfer {d['flashinfer_ms']:.2f} ms")
        print(f"backend end to end ({e['layers']} layers): mixed forward max rel {e['mixed']['max_rel']:.2e}, "
              f"decode batch max rel {e['decode']['max_rel']:.2e} ({'OK' if e['ok'] else 'FAIL'}); runner step at "
              f"batch {e['batch']}: SDPA {e['sdpa_step_ms']:.2f} ms, FlashInfer {e['flashinfer_step_ms']:.2f} ms")
    return r


def flashinfer_check(cfg: dict, args, device, dtype, sh: Shapes, page_size: int, batch: int, seed: int) -> dict:
    """Both checks; `ok` only when both pass. 1. The raw wrapper: FlashInfer's non-causal batch
    prefill over our pool's pages (NHD view) against sdpa_attention on random q/k/v, a sequence on
    gathered pages included; then one layer's attention at the decode shape timed three ways (SDPA
    loop, padded SDPA as the CUDA-graph path runs it, FlashInfer). 2. Our backend end to end:
    ModelRunner with attention_backend="flashinfer" against "sdpa" on a two-layer model of the
    benchmarked width (a packed forward of two prefills, one on gathered pages, and two dual-cache
    block steps, then a decode-only batch), and the step time of both at the largest batch."""
    if device.type != "cuda":
        return {"skipped": f"no CUDA device (device={device.type})"}
    try:
        import flashinfer
    except Exception as exc:
        return {"skipped": f"flashinfer not importable: {type(exc).__name__}: {exc}"}
    out = flashinfer_vs_sdpa(flashinfer, args, device, dtype, sh, page_size, batch)
    out["ok_kernel"] = out.pop("ok")
    out["backend"] = backend_check(cfg, device, dtype, sh, page_size, batch, seed)
    out["ok"] = out["ok_kernel"] and out["backend"]["ok"]
    return out


def flashinfer_vs_sdpa(flashinfer, args, device, dtype, sh: Shapes, page_size: int, batch: int) -> dict:
    H, Hkv, D = args.num_heads, args.num_kv_heads, args.head_dim
    L = sh.prompt + sh.answer
    spans = [(L, sh.prompt, sh.block), (L - 5, sh.prompt, sh.block), (129, 96, 32), (33, 0, 33)]  # kv, pos, q

    def setup(specs, fragment: bool):
        pages = sum(-(-kv // page_size) for kv, _, _ in specs) + fragment   # one spare page: the last
        pool = KVPool(1, pages, page_size, Hkv, D, dtype, device)                # sequence gets gathered pages
        if fragment:
            pool.allocate("gap", page_size), pool.allocate("pin", page_size), pool.free("gap")
        pool.layers[0].k.normal_(), pool.layers[0].v.normal_()
        seqs, page_ids, indptr, last, q0 = [], [], [0], [], 0
        for i, (kv, pos, qn) in enumerate(specs):
            al = pool.allocate(f"s{i}", kv)
            ids = None if al.slot_ids is None else al.slot_ids.to(device)
            seqs.append(SeqSpan(q0, qn, pos, kv, al.slot_base, ids, al.pages))
            page_ids += al.pages
            indptr.append(len(page_ids))
            last.append(kv - (len(al.pages) - 1) * page_size)
            q0 += qn
        i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=device)
        q = torch.randn(q0, H, D, dtype=dtype, device=device)
        return pool, seqs, q, (i32([s.q_start for s in seqs] + [q0]), i32(indptr), i32(page_ids), i32(last))

    def fed_kv(pool, seqs):   # the fed rows' K/V as stored, so sdpa_attention writing them back is a no-op
        rows = torch.cat([torch.arange(s.pos_start, s.pos_start + s.q_len, device=device) + s.slot_base
                          if s.slot_ids is None else s.slot_ids[s.pos_start: s.pos_start + s.q_len] for s in seqs])
        return pool.layers[0].k[rows].clone(), pool.layers[0].v[rows].clone()

    ws = torch.zeros(256 * 2**20, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")

    def fi_run(pool, q, meta):
        wrapper.plan(*meta, H, Hkv, D, page_size, causal=False, q_data_type=dtype, kv_data_type=dtype)
        k = pool.layers[0].k.view(-1, page_size, Hkv, D)
        v = pool.layers[0].v.view(-1, page_size, Hkv, D)
        return lambda: wrapper.run(q, (k, v))

    out = {"version": getattr(flashinfer, "__version__", "?"), "page_size": page_size, "layout": "NHD"}
    pool, seqs, q, meta = setup(spans, fragment=True)
    k, v = fed_kv(pool, seqs)
    ref = sdpa_attention(q, k, v, pool.layers[0], AttentionBatch(seqs)).float()
    got = fi_run(pool, q, meta)().float()
    err = (got - ref).abs().max().item()
    out.update({"max_abs_err": err, "ref_abs_max": ref.abs().max().item(), "tol_abs": 2e-2, "ok": err <= 2e-2,
                "spans_kv_pos_q": [list(s) for s in spans],
                "gathered_seqs": sum(s.slot_ids is not None for s in seqs)})
    pool, seqs, q, meta = setup([(L, sh.prompt, sh.block)] * batch, fragment=False)
    k, v = fed_kv(pool, seqs)
    run = fi_run(pool, q, meta)
    sd = time_ms(lambda: sdpa_attention(q, k, v, pool.layers[0], AttentionBatch(seqs)), device, 3, 10)
    fi = time_ms(run, device, 3, 10)
    pad = padded_batch(seqs, pool, device)
    pd = time_ms(lambda: padded_attention(q, k, v, pool.layers[0], pad), device, 3, 10)
    out["decode_shape_one_layer"] = {"batch": batch, "q_len": sh.block, "kv_len": L, "sdpa_loop_ms": median(sd),
                                     "padded_sdpa_ms": median(pd), "flashinfer_ms": median(fi)}
    return out


def padded_batch(seqs: list[SeqSpan], pool: KVPool, device) -> PaddedBatch:
    """The graph path's metadata (cuda_graph.padded_metadata) for equal-q_len sequences with
    host page lists, keys padded to the longest."""
    keys, page = max(s.kv_len for s in seqs), pool.page_size
    table = torch.full((len(seqs), -(-keys // page)), pool.scratch_page, dtype=torch.int64)
    for i, s in enumerate(seqs):
        table[i, : len(s.pages)] = torch.tensor(s.pages)
    kv_len = torch.tensor([s.kv_len for s in seqs])
    positions = torch.cat([torch.arange(s.pos_start, s.pos_start + s.q_len) for s in seqs])
    return padded_metadata(table.to(device), kv_len.to(device), positions.to(device),
                           torch.arange(keys, device=device), page, seqs[0].q_len)


def backend_check(cfg: dict, device, dtype, sh: Shapes, page_size: int, batch: int, seed: int,
                  backends: tuple[str, str] = ("sdpa", "flashinfer")) -> dict:
    layers = 2
    model, args = build_model({**cfg, "n_layers": layers}, device, dtype, seed)
    L, s = sh.prompt + sh.answer, sh.prompt
    e = s + sh.block
    g = torch.Generator().manual_seed(seed)
    canvases = [canvas(args, sh.prompt, sh.answer, sh.block, g) for _ in range(batch)]
    lo, hi = fed_range("dual", False, s, e, L, args.logit_shift)
    out = {"layers": layers, "batch": batch, "tol_rel": 3e-2 if dtype != torch.float32 else 1e-4}
    logits = {}
    b_canvas = torch.cat([canvases[1], canvases[1][-(page_size // 2):]])
    pa, pb = -(-L // page_size), -(-b_canvas.numel() // page_size)
    for name in backends:
        # Mixed forward: one page short of a second contiguous run, so b's pages are gathered.
        pool = KVPool(layers, pa + pb + 1, page_size, args.num_kv_heads, args.head_dim, dtype, device)
        pool.allocate("gap", page_size), pool.allocate("pin", page_size), pool.free("gap")
        runner = ModelRunner(model, args, pool, device, attention_backend=name)
        assert name != "flashinfer" or runner.attention is not sdpa_attention, "flashinfer backend not selected"
        a0, a1 = pool.allocate("a", L), pool.allocate("b", b_canvas.numel())
        assert a0.slot_ids is None and a1.slot_ids is not None
        prefill = [ForwardItem(canvases[0], a0, 0, L, s, e), ForwardItem(b_canvas, a1, 0, b_canvas.numel(), s, e)]
        mixed = runner.forward(prefill).clone()
        prefill = [ForwardItem(canvases[0], a0, lo, hi, s, e), ForwardItem(b_canvas, a1, lo, hi, s, e)]
        mixed = torch.cat([mixed, runner.forward(prefill)])      # and the dual steps over that cache
        # Decode-only batch (eager: the backend, not the graph path).
        pool = KVPool(layers, batch * pa, page_size, args.num_kv_heads, args.head_dim, dtype, device)
        runner = ModelRunner(model, args, pool, device, attention_backend=name)
        allocs = [pool.allocate(f"d{i}", L) for i in range(batch)]
        for i in range(0, batch, 8):
            runner.forward([ForwardItem(canvases[j], allocs[j], 0, L, s, e) for j in range(i, min(batch, i + 8))])
        items = [ForwardItem(canvases[i], allocs[i], lo, hi, s, e) for i in range(batch)]
        decode = runner.forward(items).clone()
        step = median(time_ms(lambda: runner.forward(items), device, 3, 10))
        logits[len(logits)] = (mixed, decode, step)
    (m0, d0, t0), (m1, d1, t1) = logits[0], logits[1]
    out.update({"mixed": compare(m1, m0, out["tol_rel"]), "decode": compare(d1, d0, out["tol_rel"]),
                "sdpa_step_ms": t0, "flashinfer_step_ms": t1})
    out["ok"] = out["mixed"]["ok"] and out["decode"]["ok"]
    return out
