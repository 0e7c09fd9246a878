"""GPU benchmark (docs/gpu.md; 5-7 minutes on one H200): a LLaDA-8B-shaped model with random weights, its
correctness, GEMM rate, block-step and prefill times, FlashInfer, serving and capacity at matched
latency. Markdown tables on stdout; everything in --out (JSON, rewritten after every phase).

    python -m bench.gpu                                   # on the GPU box (scripts/gpu_run.sh)
    python -m bench.gpu --only serving,capacity           # the fallback after a run cut short
    python -m bench.gpu --smoke --out /tmp/gpu.json       # CPU, tiny shapes, < 1 minute (CI)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from bench import gpu_flashinfer as FI
from bench import gpu_parts as P
from bench.gpu_block_causal import block_causal_check
from bench.gpu_capacity import BASELINE, DEFAULT, capacity_comparison
from bench.gpu_harness import PHASES, Bench, env_info, print_table, setup_logging
from bench.harness import Timer, parser
from dllm_server.config import ServerConfig
from dllm_server.worker.cuda_graph import DecodeGraphs
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner, fed_range


def main() -> int:
    ap = parser(__doc__, seed=0)
    ap.add_argument("--smoke", action="store_true", help="tiny fp32 model and shapes (CPU; what CI runs)")
    default_out = Path(os.environ["OUT"]) / "gpu_bench.json" if os.environ.get("OUT") else Path("runs/gpu_bench.json")
    ap.add_argument("--out", type=Path, default=default_out)
    ap.add_argument("--time-budget-s", type=float, default=420.0, help="phases past it are skipped with a note")
    ap.add_argument("--layers", type=int, help="override the layer count of the benchmarked model")
    ap.add_argument("--serve-layers", type=int, default=4, help="layers of the serving model (same width)")
    ap.add_argument("--device", help="default: cuda when available (cpu with --smoke)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: 1 with --smoke)")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                    help="default: bfloat16 (float32 with --smoke)")
    ap.add_argument("--skip-serving", action="store_true")
    ap.add_argument("--skip-flashinfer", action="store_true")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="also measure the default scheduler on one instance of this degree in the capacity phase "
                         "(one GPU per rank: skipped with a note when fewer are visible)")
    ap.add_argument("--only", type=lambda v: set(v.split(",")), metavar="PHASE,...",
                    help=f"run just these of {','.join(PHASES)} (model is built when a phase needs it); "
                         "the fallback run after a first run cut short")
    ap.add_argument("--flashinfer-only", action="store_true", help=argparse.SUPPRESS)   # the child of that phase
    a = ap.parse_args()
    if a.only and not a.only <= set(PHASES):
        ap.error(f"--only: unknown phase(s) {sorted(a.only - set(PHASES))}; choose from {', '.join(PHASES)}")
    if a.only and a.only & {"correctness", "gemm", "decode", "prefill"}:
        a.only.add("model")
    log_tail = setup_logging()
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() and not a.smoke else "cpu"))
    if a.threads or a.smoke:
        torch.set_num_threads(a.threads or 1)
    dtype = getattr(torch, a.dtype or ("float32" if a.smoke else "bfloat16"))
    cfg = dict(P.SMOKE_CFG if a.smoke else P.LLADA_8B)
    if a.layers:
        cfg["n_layers"] = a.layers
    sh = P.SMOKE if a.smoke else P.FULL
    tol = P.tolerance(dtype)
    page_size = ServerConfig().page_size
    margs = P.llada.args_from_config(cfg)   # the model's shape (no weights)
    if a.flashinfer_only:
        r = FI.flashinfer_check(cfg, margs, device, dtype, sh, page_size, max(sh.batches), a.seed)
        if device.type == "cuda":
            r["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        a.out.write_text(json.dumps(r, indent=2, default=str))
        return 0
    b = Bench(a.out, a.time_budget_s, device, a.only, log_tail)
    b.res["meta"] = meta = env_info(device, dtype, cfg, sh, a.smoke)
    print(f"# dllm-server GPU benchmark{' (SMOKE: tiny shapes)' if a.smoke else ''}\n")
    for k in ("date", "device", "gpu", "gpu_memory_gib", "torch", "cuda", "flashinfer", "dtype"):
        print(f"- {k}: {meta[k]}")
    print(f"- model: d={cfg['d_model']} layers={cfg['n_layers']} heads={cfg['n_heads']} mlp={cfg['mlp_hidden_size']} "
          f"vocab={cfg['vocab_size']}, random weights; output: {a.out}")
    if device.type == "cpu" and not a.smoke:
        print("WARNING: full 8B shapes on a CPU take hours; use --smoke")
    st: dict = {}

    def build():
        with Timer() as t:
            st["model"], st["args"] = P.build_model(cfg, device, dtype, a.seed)
            P.sync(device)
        n = sum(p.numel() for p in st["model"].parameters())
        emb = cfg["embedding_size"] * cfg["d_model"] * 2
        r = {"params": n, "params_non_embedding": n - emb, "build_s": t.s,
             "weights_gib": n * torch.finfo(dtype).bits / 8 / 2**30}
        print(f"{n / 1e6:,.1f} M parameters ({r['weights_gib']:.2f} GiB), built on {device} in {r['build_s']:.1f} s")
        return r

    def correctness():
        r = P.check_paged_vs_dense(st["model"], st["args"], device, dtype, sh, tol, a.seed, page_size)
        rows = []
        for case, v in r.items():
            if case == "ok":
                continue
            if "error" in v:
                rows.append([case, "-", "ERROR", v["error"][:120], "", "", "", "", False])
                continue
            for check, c in v.items():
                rows.append([case, check, c["max_abs"], c["max_rel"], c["mean_rel"], c["worst_row_mean_rel"],
                             c["argmax_agree"], c["tol_rel"], c["ok"]])
        print_table(["case", "check", "max abs err", "max rel err (vs max abs ref)", "mean rel err",
                     "worst row mean rel", "argmax agree", "tol", "ok"], rows)
        print(f"\npaged SDPA vs dense: {'OK' if r['ok'] else 'FAIL'}")
        return r

    def gemm():
        rows = P.gemm_rates(st["args"], device, dtype, sh.gemm_tokens, sh.warmup, sh.repeats)
        print_table(["GEMM", "M (tokens)", "K", "N", "ms", "TFLOP/s"],
                    [[r["name"], r["m"], r["k"], r["n"], r["ms"], r["tflops"]] for r in rows])
        peak = max(r["tflops"] for r in rows)
        print(f"\ndense {str(dtype).removeprefix('torch.')} GEMM rate of this machine (best shape): {peak:.3g} TFLOP/s")
        return {"rows": rows, "peak_tflops": peak}

    def kv_pool():
        L = sh.prompt + sh.answer
        pages = max(max(sh.batches) * -(-L // page_size), -(-max(sh.prefill_lens) // page_size))
        st["pool"] = KVPool(st["args"].num_layers, pages, page_size, st["args"].num_kv_heads,
                            st["args"].head_dim, dtype, device)
        return st["pool"]

    def peak_tflops():
        return (b.res.get("gemm") or {}).get("peak_tflops")

    def decode_rows(args, model, pool, allocs):
        tm = P.TimedModel(model, device)
        runner = ModelRunner(tm, args, pool, device)
        g = torch.Generator().manual_seed(a.seed)
        L, s = sh.prompt + sh.answer, sh.prompt
        e = s + sh.block
        lo, hi = fed_range("dual", False, s, e, L, args.logit_shift)
        n = len(allocs)
        canvases = [P.canvas(args, sh.prompt, sh.answer, sh.block, g) for _ in range(n)]
        for i in range(0, n, 8):     # a real cache to attend over (the graph check compares against it)
            runner.forward([ForwardItem(canvases[j], allocs[j], 0, L, s, e) for j in range(i, min(n, i + 8))])
        tm.take()
        # The fixed-shape path a worker takes for decode-only iterations: CUDA graphs on a GPU
        # (captured on first use of a shape), the same buffers run eagerly elsewhere.
        graphs = DecodeGraphs(model, args, pool, device, max(sh.batches), capture=device.type == "cuda")
        graph_runner = ModelRunner(model, args, pool, device, decode_graphs=graphs)
        rows, graph_ok = [], True
        for batch in sh.batches:
            if b.left() < 0:
                b.skip(f"decode: batches from {batch} on (time budget)")
                break
            items = [ForwardItem(canvases[i], allocs[i], lo, hi, s, e) for i in range(batch)]
            step = P.median(P.time_ms(lambda: runner.forward(items), device, sh.warmup, sh.repeats))
            model_ms = P.median(tm.take()[sh.warmup:])
            eager_logits = runner.forward(items).clone()
            tm.take()
            with Timer() as t:
                graph_logits = graph_runner.forward(items, decode_only=True).clone()
                P.sync(device)
            first_s = t.s                                  # includes the capture of this shape
            graph_ms = P.median(P.time_ms(lambda: graph_runner.forward(items, decode_only=True), device,
                                          sh.warmup, sh.repeats))
            check = P.compare(graph_logits, eager_logits, tol)
            graph_ok &= check["ok"]
            fed = batch * (hi - lo)
            flops = P.forward_flops(args, fed, batch * sh.block, fed * L)
            rows.append({"batch": batch, "fed_tokens": fed, "model_ms": model_ms, "step_ms": step,
                         "graph_step_ms": graph_ms, "graph_first_call_s": first_s, "graph_vs_eager": check,
                         "model_tflops": flops / model_ms / 1e9, "flops": flops,
                         "output_tok_s_at_1_per_step": batch / (min(step, graph_ms) / 1e3),
                         "step_vs_batch1": model_ms / (rows[0]["model_ms"] if rows else model_ms)})
        return rows, graphs, graph_ok

    def decode():
        args, model = st["args"], st["model"]
        pool = st.get("pool") or kv_pool()
        n = max(sh.batches)
        with P.held(pool, {f"dec{i}": sh.prompt + sh.answer for i in range(n)}) as allocs:
            rows, graphs, graph_ok = decode_rows(args, model, pool, allocs)
            reserved = torch.cuda.memory_reserved(device) / 2**30 if device.type == "cuda" else None
        if not rows:
            return {"rows": [], "graphs": {"ok": graph_ok}}
        L = sh.prompt + sh.answer
        print_table(["batch", "fed tokens", "model step (ms)", "x batch 1", "runner step (ms)",
                     "graph step (ms)", "graph first call (s)", "graph vs eager max rel", "worst row mean rel",
                     "argmax agree", "model TFLOP/s", "output tok/s at 1 token/step"],
                    [[r["batch"], r["fed_tokens"], r["model_ms"], r["step_vs_batch1"], r["step_ms"],
                      r["graph_step_ms"], r["graph_first_call_s"], r["graph_vs_eager"]["max_rel"],
                      r["graph_vs_eager"]["worst_row_mean_rel"], r["graph_vs_eager"]["argmax_agree"],
                      r["model_tflops"], r["output_tok_s_at_1_per_step"]] for r in rows])
        top = rows[-1]
        peak = peak_tflops()
        util = {"batch": top["batch"], "model_tflops": top["model_tflops"], "gemm_peak_tflops": peak,
                "fraction_of_gemm_peak": top["model_tflops"] / peak if peak else None,
                "flops_note": "2 x block params x fed tokens + 2 x LM head x logit rows + 4 x layers x hidden x q*kv"}
        best = max(rows, key=lambda r: r["output_tok_s_at_1_per_step"])
        sat = {"batch": best["batch"], "output_tok_s_at_1_per_step": best["output_tok_s_at_1_per_step"],
               "block_positions_per_s": best["batch"] * sh.block / (best["step_ms"] / 1e3)}
        frac = "n/a" if util["fraction_of_gemm_peak"] is None else f"{100 * util['fraction_of_gemm_peak']:.1f} %"
        print(f"\nbatch {top['batch']}: model {top['model_tflops']:.3g} TFLOP/s = {frac} of the measured GEMM rate; "
              f"saturation: {sat['output_tok_s_at_1_per_step']:.0f} output tok/s at 1 token/step "
              f"(batch {sat['batch']}, runner step); multiply by tokens/step (threshold decoding commits >1)")
        print(f"fixed-shape decode path ({'CUDA graphs' if graphs.capture else 'eager, no capture'}): "
              f"{len(graphs.shapes)} shapes, logits {'match' if graph_ok else 'DIFFER FROM'} the eager path"
              + (f"; {reserved:.2f} GiB reserved by torch after the captures" if reserved is not None else ""))
        return {"canvas": L, "q_tokens": sh.block, "rows": rows, "utilisation": util, "saturation": sat,
                "graphs": {"captured": graphs.capture, "shapes": len(graphs.shapes), "ok": graph_ok,
                           "reserved_gib_after": reserved}}

    def prefill():
        args, model = st["args"], st["model"]
        pool = st.get("pool") or kv_pool()
        tm = P.TimedModel(model, device)
        runner = ModelRunner(tm, args, pool, device)
        g = torch.Generator().manual_seed(a.seed + 1)
        rows, peak = [], peak_tflops()
        for n in sh.prefill_lens:
            if n > args.max_len or b.left() < 0:
                b.skip(f"prefill: length {n} ({'over max_len' if n > args.max_len else 'time budget'})")
                continue
            c = torch.full((n,), args.mask_id, dtype=torch.int64)
            c[: n - sh.block] = torch.randint(*P.prompt_id_range(args), (n - sh.block,), generator=g)
            with P.held(pool, {"prefill": n}) as (alloc,):
                item = [ForwardItem(c, alloc, 0, n, n - sh.block, n)]
                step = P.median(P.time_ms(lambda: runner.forward(item), device, sh.warmup, sh.repeats))
                model_ms = P.median(tm.take()[sh.warmup:])
            tf = P.forward_flops(args, n, sh.block, n * n) / model_ms / 1e9
            rows.append({"length": n, "model_ms": model_ms, "step_ms": step, "tok_s": n / (model_ms / 1e3),
                         "model_tflops": tf, "fraction_of_gemm_peak": tf / peak if peak else None})
        print_table(["length", "model (ms)", "runner step (ms)", "prefill tok/s", "model TFLOP/s", "of GEMM peak"],
                    [[r["length"], r["model_ms"], r["step_ms"], r["tok_s"], r["model_tflops"],
                      "n/a" if r["fraction_of_gemm_peak"] is None else f"{100 * r['fraction_of_gemm_peak']:.1f} %"]
                     for r in rows])
        return {"batch": 1, "rows": rows}

    def checkpoint() -> Path:
        """The serving model, written once for the serving and capacity phases."""
        if "ckpt" not in st:
            st["folder"] = Path(tempfile.mkdtemp(prefix="dllm-gpu-bench-"))
            with Timer() as t:
                st["ckpt"] = P.write_checkpoint(cfg, a.serve_layers, device, dtype, a.seed, st["folder"])
            st["checkpoint_write_s"] = t.s
        return st["ckpt"]

    def serving():
        # The closed batch sizes itself to the time left; keep 3 minutes for the capacity phase (two
        # server starts of ~30 s, two searches of >= 33 s at 0.3 s per request, two stops).
        left = (lambda: b.left() - 180.0) if gpu and b.wanted("capacity") else b.left
        r = P.serving_comparison(checkpoint(), margs, sh, device, str(dtype).removeprefix("torch."), left, a.seed)
        r.update({"checkpoint_write_s": st["checkpoint_write_s"],
                  "model": f"{a.serve_layers} layers of the benchmarked width (d={cfg['d_model']}, vocab "
                           f"{cfg['vocab_size']}), not {cfg['n_layers']}",
                  "method": "closed batch: every request submitted at t=0, in-process (capacity at matched "
                            "latency is the next phase)"})
        print(f"serving model: {r['model']}; {r['method']}")
        if "skipped" in r:
            b.skip(f"serving: {r['skipped']}")
            return r
        print(f"requests: {r['requests']} x (prompt {sh.serve_prompt}, max_tokens {sh.serve_max_tokens}, steps "
              f"{sh.serve_steps}, ignore_eos, greedy)\n")
        print_table(["configuration", "output tok/s", "req/s", "mean latency (s)", "p50 (s)", "p99 (s)",
                     "iterations", "max decodes / iteration", "time in forward", "errors"],
                    [[k, v["output_tok_s"], v["req_s"], v["mean_latency_s"], v["p50_latency_s"], v["p99_latency_s"],
                      v["iterations"], v["max_decodes_per_iteration"], f"{100 * v['forward_share']:.0f} %",
                      v["errors"]] for k, v in r["runs"].items()])
        print(f"\nthroughput ratio default / batch-1: {r['throughput_ratio']:.2f}x; mean latency ratio "
              f"{r['mean_latency_ratio']:.2f}x")
        return r

    def capacity():
        ckpt = checkpoint()
        work = st["folder"] / "capacity"
        work.mkdir(exist_ok=True)
        # 5 s kept for the JSON and the clean-up after it.
        configs = [BASELINE, DEFAULT]
        tp = a.tensor_parallel_size
        if tp > 1:
            gpus = torch.cuda.device_count() if gpu else None
            if gpus is not None and gpus < tp:
                b.skip(f"capacity: tensor parallel {tp}: needs {tp} GPUs, {gpus} visible")
            else:
                configs.append((f"default scheduler, TP {tp}", ["--tensor-parallel-size", str(tp)]))
        r = capacity_comparison(ckpt, margs, sh, str(device), str(dtype).removeprefix("torch."),
                                lambda: b.left() - 5.0, a.seed, work, configs=tuple(configs))
        print(f"serving model: {a.serve_layers} layers of the benchmarked width; {r['method']}")
        for name, why in r["skipped"].items():
            b.skip(f"capacity: {name}: {why}")
        for name, f in r["failed"].items():      # an error of one configuration; the other's result stays
            b.res["errors"][f"capacity: {name}"] = f["error"][:1000]
            print(f"capacity: {name} FAILED: {f['error'][:500]}\n  server log: {f.get('server_log_notes', [])[-5:]}")
        if "slo_e2e_ms" in r:
            print(f"SLO: e2e latency <= {r['slo_e2e_ms']:.0f} ms (unloaded latency "
                  f"{r['baseline_unloaded_latency_s']:.3f} s "
                  f"on the {r['slo_from']})\n")
        if r["runs"]:
            print_table(["configuration", "capacity (req/s)", "first failing rate", "probes", "requests / probe",
                         "unloaded latency (s)", "server start (s)", "cut short"],
                        [[k, v["capacity_req_s"], v["upper_req_s"], v["probes"], v["prompts_per_probe"],
                          v["unloaded_latency_s"], v["server_start_s"], v["partial"]] for k, v in r["runs"].items()])
        ratio = r["capacity_ratio"]
        print(f"\ncapacity ratio default / batch-1 at matched latency: {'n/a' if ratio is None else f'{ratio:.2f}x'}")
        if "tp_capacity_ratio" in r:
            print(f"capacity ratio one TP {tp} instance / one TP 1 instance: {r['tp_capacity_ratio']:.2f}x")
        return r

    def block_causal():
        r = block_causal_check(device, dtype, a.smoke, a.seed, b.left)
        print(f"SDAR-shaped block-causal model {r['shape']} in {r['dtype']}, {r['requests']} requests x (prompt "
              f"{r['prompt']}, max_tokens {r['max_tokens']}), threshold 0.9:\n")
        print_table(["finalise", "seconds", "forwards / answer", "output tok/s"],
                    [[m, v["seconds"], v["forwards_per_answer"], v["output_tok_s"]] for m, v in r["runs"].items()])
        print(f"\nanswers equal to the fused finalise's: {r.get('agree_with_fused')}; prefix cache: "
              f"{r.get('prefix_cache')}; {'OK' if r['ok'] else 'FAIL'}")
        return r

    def flashinfer():
        limit = max(15.0, min(120.0, b.left() - st.get("reserve_s", 0.0)))
        return FI.run_child("bench.gpu", a.out, device, dtype, a.seed, a.smoke, a.layers, limit)

    gpu = device.type == "cuda"
    try:
        b.phase("model", build)
        if "model" in st:
            b.phase("correctness", correctness)
            b.phase("gemm", gemm)
            b.phase("decode", decode, need_s=30 if gpu else 0)
            b.phase("prefill", prefill, need_s=10 if gpu else 0)
            st.pop("pool", None), st.pop("model", None)
            P.free_device_memory(device)
        # FlashInfer before serving, bounded, so a first-use JIT compile cannot eat the serving phases.
        serve = not a.skip_serving and (b.wanted("serving") or b.wanted("capacity"))
        st["reserve_s"] = 240.0 if gpu and serve else 0.0
        if a.skip_flashinfer:
            b.skip("flashinfer: --skip-flashinfer")
        else:
            b.phase("flashinfer", flashinfer, need_s=20 if gpu else 0)
        if a.skip_serving:
            b.skip("serving: --skip-serving")
            b.skip("capacity: --skip-serving")
        else:
            b.phase("serving", serving, need_s=60 if gpu else 0)
            b.phase("capacity", capacity, need_s=90 if gpu else 0)
        b.phase("block_causal", block_causal, need_s=45 if gpu else 0)
    finally:   # the 3.8 GB checkpoint must not stay in the temporary folder
        shutil.rmtree(st.get("folder") or "/nonexistent", ignore_errors=True)
    ok = not b.res["errors"] and (b.res.get("correctness") or {}).get("ok", not b.wanted("correctness")) \
        and (b.res.get("flashinfer") or {}).get("ok", True) \
        and ((b.res.get("decode") or {}).get("graphs") or {}).get("ok", True) \
        and (b.res.get("block_causal") or {}).get("ok", True)
    b.res["ok"] = ok
    b.save()
    print(f"\n{'OK' if ok else 'PROBLEMS (see errors / correctness in the JSON)'}: {b.res['elapsed_s']} s; "
          f"results in {a.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
