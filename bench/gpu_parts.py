"""Helpers of bench/gpu.py: the random LLaDA-8B-shaped model, device timing, the correctness
checks (paged SDPA vs dense, fresh-cache exactness), GEMM rates, FLOP counts and the
closed-batch serving comparison through the offline `LLM`. FlashInfer: gpu_flashinfer.py."""
from __future__ import annotations

import contextlib
import gc
import json
import math
import random
import statistics
import time
import types
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.harness import Timer
from dllm_server import LLM, SamplingParams
from dllm_server.model import llada
from dllm_server.checkpoint import plain_id_offset
from dllm_server.model.attention import DenseBatch
from dllm_server.model.layers import Rotary
from dllm_server.model.tiny import save_weights, write_tokenizer
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner, fed_range

# LLaDA-8B-Instruct's shape (HF config keys); weights are random.
LLADA_8B = {"architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": 4096, "n_layers": 32,
            "n_heads": 32, "n_kv_heads": 32, "mlp_hidden_size": 12288, "vocab_size": 126464,
            "embedding_size": 126464, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_sequence_length": 4096,
            "mask_token_id": 126336, "eos_token_id": 126081, "weight_tying": False, "include_bias": False}
SMOKE_CFG = {**LLADA_8B, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "mlp_hidden_size": 128,
             "vocab_size": 512, "embedding_size": 512, "max_sequence_length": 1024, "mask_token_id": 500,
             "eos_token_id": 501}


@dataclass(frozen=True)
class Shapes:
    prompt: int                 # decode canvas = prompt + answer; the dual step feeds one block
    answer: int
    block: int
    batches: tuple[int, ...]
    prefill_lens: tuple[int, ...]
    gemm_tokens: tuple[int, ...]
    warmup: int
    repeats: int
    serve_requests: int
    serve_prompt: int
    serve_max_tokens: int
    serve_steps: int
    capacity_prompts: int       # requests per rate probe of the capacity search


BATCHES = (1, 2, 4, 8, 16, 32, 64)
FULL = Shapes(512, 256, 32, BATCHES, (256, 512, 1024, 2048, 4096), (2048, 4096), 3, 10, 32, 512, 256, 64, 24)
SMOKE = Shapes(96, 64, 32, BATCHES, (64, 128, 256, 512), (256, 512), 1, 3, 4, 64, 64, 8, 8)


# ---- model ----
def build_model(cfg: dict, device: torch.device, dtype: torch.dtype, seed: int, fuse: bool = True):
    """Random weights allocated directly on the device (meta -> to_empty, then seeded in-place
    normal_ with a device generator): seconds for 8B on a GPU, no CPU init, no checkpoint.
    Fused as the server's loader fuses it (`fuse=False`: the checkpoint's names, for saving)."""
    args = llada.args_from_config(cfg)
    with torch.device("meta"):
        model = llada.LLaDAModelLM(args).to(dtype)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():   # the scheme of dllm_server.model.tiny.init_weights (peaked logits)
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or name.endswith("ln_f.weight"):
                p.fill_(1.0)
            elif "wte" in name:
                p.normal_(0.0, 1.0, generator=g)
            elif name == "model.transformer.ff_out.weight":
                p.normal_(0.0, 5.0 / p.shape[1] ** 0.5, generator=g)
            else:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5, generator=g)
    model.rotary = Rotary(args.head_dim, args.rope_theta, args.max_len).to(device)
    if fuse:
        model.fuse_projections()
    return model.eval().requires_grad_(False), args


def forward_flops(args, tokens: int, logit_rows: int, q_kv_pairs: int) -> float:
    """Matmul FLOPs of one packed forward: 2 x (block params) x fed tokens + 2 x (LM head) x logit
    rows + attention 4 x layers x hidden x sum(q_len * kv_len). Embedding lookups are free."""
    d, kv = args.hidden, args.num_kv_heads * args.head_dim
    block = args.num_layers * (2 * d * d + 2 * d * kv + 3 * d * args.mlp_hidden)
    return 2.0 * block * tokens + 2.0 * d * args.embedding_size * logit_rows + 4.0 * args.num_layers * d * q_kv_pairs


def prompt_id_range(args) -> tuple[int, int]:
    """[lo, hi) of ordinary ids for random prompts: below the special ids where they sit at the top of
    the vocabulary (LLaDA, Dream, this bench's random checkpoints), above them where they come first
    (the demo model v2's BPE)."""
    offset = plain_id_offset([args.mask_id, args.eos_id])
    return (1, min(args.vocab_size, args.mask_id, args.eos_id)) if offset == 0 else (offset, args.vocab_size)


def canvas(args, prompt: int, answer: int, block: int, g: torch.Generator) -> torch.Tensor:
    """Random prompt, first answer block decided, one commit in the second block, rest masked."""
    lo, hi = prompt_id_range(args)
    c = torch.full((prompt + answer,), args.mask_id, dtype=torch.int64)
    c[:prompt] = torch.randint(lo, hi, (prompt,), generator=g)
    c[prompt: prompt + block] = torch.randint(lo, hi, (block,), generator=g)
    c[prompt + block + 1] = 7
    return c


# ---- timing ----
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """CUDA events on a GPU (device timeline), perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3


def time_ms(fn, device: torch.device, warmup: int, repeats: int) -> list[float]:
    clock = Clock(device)
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(repeats):
        a = clock.mark()
        fn()
        b = clock.mark()
        out.append(clock.ms(a, b))
    return out


class TimedModel:
    """Stands in for the model inside a ModelRunner: times just the model call, so one runner
    call yields both the model time and the whole runner step (packing, block logits)."""

    def __init__(self, model, device: torch.device):
        self.model, self.clock, self.marks = model, Clock(device), []

    def __call__(self, *a):
        s = self.clock.mark()
        out = self.model(*a)
        self.marks.append((s, self.clock.mark()))
        return out

    def take(self) -> list[float]:
        ms = [self.clock.ms(a, b) for a, b in self.marks]
        self.marks.clear()
        return ms


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


# ---- correctness ----
def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of two paths of the same forward (docs/gpu.md, "Correctness"). bf16: a
    32-layer random model of this kind differs from its fp32 self by 1.9-2.0e-2 (max_rel and
    worst_row_mean_rel, d 256 and 1024, measured on the CPU), so two independently rounded bf16
    paths may differ by up to ~4e-2; 0.1 leaves 2.5x over that, while a row computed from the
    wrong sequence's KV scores 0.8-1.3. fp32: exact up to summation order."""
    return 1e-4 if dtype == torch.float32 else 0.1


def compare(got: torch.Tensor, ref: torch.Tensor, tol: float) -> dict:
    """Max and mean error, the worst row's mean error (robust to one outlier element, and not
    diluted when one sequence of a batch is wrong) and argmax agreement (reported only: random
    weights give small top-1 margins). Gate: max_rel and worst_row_mean_rel both <= tol."""
    got, ref = got.float().reshape(-1, got.shape[-1]), ref.float().reshape(-1, ref.shape[-1])
    diff = (got - ref).abs()
    rel = float(diff.max() / ref.abs().max().clamp_min(1e-12))
    row = float((diff.mean(-1) / ref.abs().mean(-1).clamp_min(1e-12)).max())
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "max_rel": rel,
            "mean_rel": float(diff.mean() / ref.abs().mean().clamp_min(1e-12)), "worst_row_mean_rel": row,
            "argmax_agree": float((got.argmax(-1) == ref.argmax(-1)).float().mean()), "tol_rel": tol,
            "ok": rel <= tol and row <= tol}


def worst(parts: list[dict]) -> dict:
    out = max(parts, key=lambda r: max(r["max_rel"], r["worst_row_mean_rel"]))
    return {**out, "argmax_agree": min(r["argmax_agree"] for r in parts), "ok": all(r["ok"] for r in parts)}


@contextlib.contextmanager
def held(pool: KVPool, sizes: dict[str, int]):
    """Pages for each owner, freed again when the body ends, also when it raises: a failed phase
    must not leave the next one "out of KV pages"."""
    allocs: dict[str, object] = {}
    try:
        for owner, n in sizes.items():
            allocs[owner] = pool.allocate(owner, n)
        yield list(allocs.values())
    finally:
        for owner in allocs:
            pool.free(owner)


@torch.inference_mode()
def dense_logits(model, args, c: torch.Tensor, device) -> torch.Tensor:
    n = c.numel()
    pos = torch.arange(n, device=device)
    return model(c.to(device), pos, DenseBatch(1), None, pos)[:, : args.vocab_size].float().cpu()


def check_paged_vs_dense(model, args, device, dtype, sh: Shapes, tol: float, seed: int, page_size: int) -> dict:
    """The runner's paged SDPA path against the dense no-cache forward, for (a) one canvas on
    contiguous pages and (b) a packed batch adding a canvas on non-contiguous pages (gathered
    through slot_ids). Per case: the full-canvas refresh's answer logits, then a dual-cache block
    step right after it (fresh-cache exactness)."""
    g = torch.Generator().manual_seed(seed)
    L = sh.prompt + sh.answer
    pages = -(-L // page_size)
    pool = KVPool(args.num_layers, 2 * pages + 1, page_size, args.num_kv_heads, args.head_dim, dtype, device)
    pool.allocate("gap", page_size), pool.allocate("pin", page_size), pool.free("gap")
    canvases = [canvas(args, sh.prompt, sh.answer, sh.block, g) for _ in range(2)]
    allocs = [pool.allocate("r0", L), pool.allocate("r1", L)]
    assert allocs[0].slot_ids is None and allocs[1].slot_ids is not None, "fragmentation set-up failed"
    runner = ModelRunner(model, args, pool, device)
    refs = [dense_logits(model, args, c, device) for c in canvases]
    s, e = sh.prompt + sh.block, sh.prompt + 2 * sh.block
    a, b = fed_range("dual", False, s, e, L, args.logit_shift)
    out = {}
    for name, idx in (("contiguous", [0]), ("packed_with_gathered_pages", [0, 1])):
        try:
            full = runner.forward([ForwardItem(canvases[i], allocs[i], 0, L, sh.prompt, L) for i in idx]).cpu()
            step = runner.forward([ForwardItem(canvases[i], allocs[i], a, b, s, e) for i in idx]).cpu()
            out[name] = {"refresh": worst([compare(full[k], refs[i][sh.prompt:], tol) for k, i in enumerate(idx)]),
                         "dual_step_after_refresh": worst([compare(step[k], refs[i][s:e], tol)
                                                           for k, i in enumerate(idx)])}
        except Exception as exc:   # e.g. a device mismatch on the gathered-pages path
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:500], "ok": False}
    out["ok"] = all(c["ok"] if "error" in c else c["refresh"]["ok"] and c["dual_step_after_refresh"]["ok"]
                    for c in list(out.values()))
    return out


# ---- GEMM rate ----
def gemm_rates(args, device, dtype, tokens: tuple[int, ...], warmup: int, repeats: int) -> list[dict]:
    d, mlp, kv = args.hidden, args.mlp_hidden, args.num_kv_heads * args.head_dim
    shapes = [("q/k/v/out proj", d, kv), ("MLP gate/up", d, mlp), ("MLP down", mlp, d),
              ("LM head", d, args.embedding_size)]
    inner = 10 if device.type == "cuda" else 1
    rows = []
    for t in tokens:
        for name, k, n in shapes:
            x = torch.randn(t, k, dtype=dtype, device=device)
            w = torch.randn(n, k, dtype=dtype, device=device) / k ** 0.5

            def run():
                for _ in range(inner):
                    F.linear(x, w)
            ms = median(time_ms(run, device, warmup, repeats)) / inner
            rows.append({"name": name, "m": t, "k": k, "n": n, "ms": ms, "tflops": 2 * t * k * n / ms / 1e9})
    return rows


# ---- serving (offline LLM, closed batch) ----
class _Stamped:
    """A request's event sink that notes when its final output arrives, then passes every event on."""
    __slots__ = ("inner", "request_id", "finished_at")

    def __init__(self, inner, request_id: str, finished_at: dict[str, float]):
        self.inner, self.request_id, self.finished_at = inner, request_id, finished_at

    def put_nowait(self, event) -> None:
        if event.output is not None:
            self.finished_at.setdefault(self.request_id, time.perf_counter())
        self.inner.put_nowait(event)


class TimedLLM(LLM):
    """The offline LLM plus each request's finish time and per-iteration timings."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.finished_at: dict[str, float] = {}
        self.iterations: list[tuple[float, float, int]] = []
        step, add = self.core.step, self.scheduler.add

        def timed_step():
            with Timer() as t:
                out = step()
            self.iterations.append((t.s, self.core.last.forward_s, self.core.last.num_decodes))
            return out

        def stamped_add(entry):
            entry.events = _Stamped(entry.events, entry.state.request_id, self.finished_at)
            return add(entry)
        self.core.step, self.scheduler.add = timed_step, stamped_add


def write_checkpoint(cfg: dict, layers: int, device, dtype: torch.dtype, seed: int, folder: Path) -> Path:
    cfg = {**cfg, "n_layers": layers, "torch_dtype": str(dtype).removeprefix("torch.")}
    model, _ = build_model(cfg, device, dtype, seed, fuse=False)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    del model
    free_device_memory(device)
    folder.mkdir(parents=True, exist_ok=True)
    save_weights(types.SimpleNamespace(state_dict=lambda: state), folder, dtype)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer(folder, "llada", cfg["max_sequence_length"])   # byte tokenizer; prompts go in as ids
    return folder


def free_device_memory(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def closed_batch(llm: TimedLLM, prompts: list, params: SamplingParams) -> dict:
    llm.finished_at.clear(), llm.iterations.clear()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    lat = sorted(llm.finished_at[o.request_id] - t0 for o in outs)
    tokens = sum(len(o.token_ids) for o in outs)
    it = llm.iterations
    return {"requests": len(outs), "wall_s": wall, "output_tokens": tokens, "output_tok_s": tokens / wall,
            "req_s": len(outs) / wall, "mean_latency_s": statistics.mean(lat), "p50_latency_s": median(lat),
            "p99_latency_s": lat[max(0, math.ceil(0.99 * len(lat)) - 1)],
            "errors": sum(o.finish_reason == "error" for o in outs),
            "first_error": next((o.error for o in outs if o.error), None),
            "forwards_per_request": median([o.stats.num_forwards for o in outs]), "iterations": len(it),
            "max_decodes_per_iteration": max((n for _, _, n in it), default=0),
            "forward_share": sum(f for _, f, _ in it) / max(1e-9, sum(s for s, _, _ in it))}


def serving_comparison(ckpt: Path, args, sh: Shapes, device, dtype_name: str, seconds_left, seed: int) -> dict:
    rng = random.Random(seed)
    lo, hi = prompt_id_range(args)
    prompts = [{"prompt_token_ids": [rng.randrange(lo, hi) for _ in range(sh.serve_prompt)]}
               for _ in range(sh.serve_requests)]
    params = SamplingParams(max_tokens=sh.serve_max_tokens, steps=sh.serve_steps, ignore_eos=True)
    common = dict(device=str(device), dtype=dtype_name, skip_tokenizer_init=True, cache="dual", block_length=sh.block)
    configs = [("batch-1 baseline (max_active_decodes=1, token_budget=None)",
                dict(max_active_decodes=1, token_budget=None)),
               ("default scheduler (token_budget=1024, max_active_decodes=64)", {})]
    out: dict = {"runs": {}, "params": {"prompt_len": sh.serve_prompt, "max_tokens": sh.serve_max_tokens,
                                        "steps": sh.serve_steps, "block_length": sh.block, "ignore_eos": True,
                                        "temperature": 0.0}}
    n = len(prompts)
    for i, (name, extra) in enumerate(configs):
        t = time.perf_counter()
        llm = TimedLLM(str(ckpt), **common, **extra)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        llm.generate(prompts[:1], params)            # warm-up: one request alone
        one = time.perf_counter() - t
        if i == 0:   # size the batch so that both runs fit (the default run is no slower per request)
            n = min(n, int(0.8 * (seconds_left() - 2 * load_s - one) / (2 * one)))
            out.update({"baseline_one_request_s": one, "load_s": load_s, "requests_planned": sh.serve_requests})
        if n >= 2:
            out["runs"][name] = closed_batch(llm, prompts[:n], params)
        del llm
        free_device_memory(device)
        if n < 2:
            out["skipped"] = f"time: one batch-1 request takes {one:.1f} s, {seconds_left():.0f} s left"
            return out
    base, dflt = out["runs"].values()
    out["requests"] = n
    out["throughput_ratio"] = dflt["output_tok_s"] / base["output_tok_s"]
    out["mean_latency_ratio"] = dflt["mean_latency_s"] / base["mean_latency_s"]
    return out
