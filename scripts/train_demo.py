"""Train the embedded demo model v2: a LLaDA-architecture masked-diffusion LM with a subword
(byte-level BPE) tokenizer, on Shakespeare, on CPU. Data, split and tokenizer: scripts/demo_data.py.

Objective (LLaDA): t ~ U(0,1), mask each token with p = (1-eps) t + eps, cross-entropy on the
masked positions weighted 1/p. A share of each batch (--chat-share) is chat rows in the LLaDA
template: only the reply, its <|eot_id|> and the <|endoftext|> padding to the row's end are
maskable (LLaDA's SFT), so the model learns to answer, to end the turn, and that everything after
the end is padding (which it then commits in few forwards). The rest are random windows of the
training text. Logits are computed for masked rows only.

Held-out figure (history.json "held_out_ce", nats per byte): 128 fixed windows of 256 bytes of the
held-out text, each tokenized by the model's own tokenizer; window k is masked at the fixed ratio
t_k = linspace(0.05, 0.95)[k] with fixed draws (seed 1234). Figure = sum of the masked tokens'
cross-entropy / sum of their UTF-8 byte lengths, so byte-level v1 and BPE v2 read on one scale
(demo_data.held_out_figures; scripts/eval_demo.py prints the same for any checkpoint).

Resumable: every --save-minutes of wall time (and at the end) it writes atomically
<out>/train_state.pt (model, optimizer, RNG states, step, history), <out>/history.json and the
HF folder <out>/model/ (bf16 safetensors carrying the step in its metadata). A cut-off run resumes
from train_state.pt by rerunning the same command; `--init-weights <out>/model/model.safetensors`
resumes from the weights alone (fresh optimizer, the step from the file's metadata, the LR
schedule continued after a REWARM_STEPS ramp, the data RNGs re-seeded from (seed, step)).

    python scripts/train_demo.py --out runs/demo2 --steps 12000
    python scripts/train_demo.py --out runs/demo2 --steps 12000 --init-weights runs/demo2/model/model.safetensors
    python scripts/train_demo.py --out /tmp/b --bench 5 --hidden 320 --layers 6   # tokens/s only
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_data as D  # noqa: E402
from demo_task_rows import TaskProbe, TaskRows, excluded_keys  # noqa: E402

from dllm_server.model import llada  # noqa: E402
from dllm_server.model.attention import DenseBatch  # noqa: E402
from dllm_server.model.tiny import init_weights, tiny_config  # noqa: E402

EPS = 1e-3
REWARM_STEPS = 50          # LR ramp of a weights-only resume (fresh AdamW moments)


class Rows:
    """Token rows for training: the text stream for windows, chat rows with their answer start."""

    def __init__(self, tok, train_texts: list[str], seq_len: int, ids: dict[str, int], seed: int):
        self.seq_len = seq_len
        self.stream = torch.tensor(tok.encode("\n\n".join(train_texts)).ids, dtype=torch.int64)
        chats = D.chat_examples(train_texts)
        self.stats = D.chat_stats(chats)
        eot, eos = ids["<|eot_id|>"], ids["<|endoftext|>"]
        prompts = tok.encode_batch([D.render_chat(c.messages) for c in chats])
        replies = tok.encode_batch([c.reply for c in chats])
        rows, starts, weights = [], [], []
        for c, p, r in zip(chats, prompts, replies):
            p, r = p.ids, r.ids
            if len(p) > seq_len // 2 or len(p) + len(r) + 1 > seq_len:
                continue
            rows.append(p + r + [eot] + [eos] * (seq_len - len(p) - len(r) - 1))
            starts.append(len(p))
            weights.append(2.0 if D.is_question_or_greeting(c) else 1.0)
        self.chat = torch.tensor(rows, dtype=torch.int64)
        self.chat_start = torch.tensor(starts, dtype=torch.int64)
        self.cum_weights = list(torch.tensor(weights, dtype=torch.float64).cumsum(0).tolist())
        self.stats["rows_used"] = len(rows)
        self.stats["text_tokens"] = int(self.stream.numel())
        self.rng = random.Random(seed)

    def batch(self, n: int, chat_share: float) -> tuple[torch.Tensor, torch.Tensor]:
        n_chat = round(n * chat_share)
        xs, ms = [], []
        for _ in range(n - n_chat):
            s = self.rng.randrange(self.stream.numel() - self.seq_len)
            xs.append(self.stream[s: s + self.seq_len])
            ms.append(torch.ones(self.seq_len, dtype=torch.bool))
        for j in self.rng.choices(range(len(self.chat)), cum_weights=self.cum_weights, k=n_chat):
            xs.append(self.chat[j])
            ms.append(torch.arange(self.seq_len) >= self.chat_start[j])
        return torch.stack(xs), torch.stack(ms)


def mdm_loss(model, x: torch.Tensor, maskable: torch.Tensor, mask_id: int, gen: torch.Generator,
             certainty: float = 0.0, certain_rows: torch.Tensor | None = None,
             certain_ids: torch.Tensor | None = None, denominators: torch.Tensor | None = None):
    """LLaDA's loss, normalised per row by its maskable length (or by `denominators`, one per row:
    the demo tasks' answer lengths); logits for masked rows only.

    `certainty` > 0 adds certainty forcing (dParallel, arXiv 2509.26488; scripts/distill_demo.py):
    that weight times the mean entropy of the masked positions of `certain_rows` (bool per batch
    row) whose argmax is already the target, pushing the model to be sure where it is right;
    `certain_ids` narrows it to positions whose target is one of those ids (the end of turn and the
    padding: sure of where an answer ends, not of its words)."""
    b, length = x.shape
    dev = x.device
    t = torch.rand(b, 1, generator=gen, device=dev)
    p = (1 - EPS) * t + EPS
    m = (torch.rand(b, length, generator=gen, device=dev) < p) & maskable
    if dev.type == "cpu" and not m.any():      # (a host sync per step on an accelerator: skipped there)
        m[0, maskable[0].nonzero()[0]] = True
    flat = torch.where(m, torch.full_like(x, mask_id), x).reshape(-1)
    rows = m.reshape(-1).nonzero().squeeze(1)
    logits = model(flat, torch.arange(length, device=dev).repeat(b), DenseBatch(b), None, rows)
    ce = F.cross_entropy(logits.float(), x.reshape(-1)[rows], reduction="none")
    weight = (1.0 / p.expand(b, length)).reshape(-1)[rows]
    per_row = maskable.sum(dim=1).float() if denominators is None else denominators
    denom = per_row[:, None].expand(b, length).reshape(-1)[rows]
    loss = (ce * weight / denom).sum() / b
    if certainty > 0 and certain_rows is not None:
        target = x.reshape(-1)[rows]
        right = certain_rows[:, None].expand(b, length).reshape(-1)[rows]
        right &= logits.argmax(-1) == target
        if certain_ids is not None:
            right &= torch.isin(target, certain_ids)
        if right.any():
            logp = logits[right].float().log_softmax(-1)      # only the rows the term reads
            loss = loss + certainty * -(logp.exp() * logp).sum(-1).mean()
    return loss


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def save_weights(model, path: Path, step: int) -> None:
    from safetensors.torch import save_file
    state = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    tmp = path.with_suffix(".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "step": str(step)})
    tmp.chmod(0o644)
    tmp.replace(path)


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="run folder (train_state.pt, history.json, model/)")
    ap.add_argument("--steps", type=int, default=12000, help="total steps (the LR schedule's length)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=192)
    ap.add_argument("--chat-share", type=float, default=0.5, help="share of each batch that is chat rows")
    ap.add_argument("--task-rows", type=int, default=0,
                    help="demo-task rows added to each batch (v3; scripts/demo_task_rows.py), besides --batch")
    ap.add_argument("--task-weights", default="", help="TASK=WEIGHT,... overriding demo_task_rows.TASK_WEIGHTS")
    ap.add_argument("--task-len", type=int, default=96, help="length of a task row (prompt, answer, padding)")
    ap.add_argument("--task-long-share", type=float, default=1 / 3,
                    help="share of steps whose task rows have --seq-len instead, like a max_tokens 128 canvas")
    ap.add_argument("--snapshot-every", type=int, default=0,
                    help="keep the weights of every this many steps in <out>/snapshots/ (checkpoint choice)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--adapt-threads", action="store_true",
                    help="on a shared machine: every 100 steps time 4 steps at the other of {1, --threads} "
                         "torch threads and keep the faster (two threads lose badly when another process "
                         "holds a core); results then differ from a fixed-thread run in rounding only")
    ap.add_argument("--autocast", choices=("none", "bf16"), default="none",
                    help="bf16 autocast for forward/backward (measured slower than fp32 on the current "
                         "Intel CPU without AMX; faster on the earlier AMD one; always on with --device cuda)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--data-workers", type=int, default=0,
                    help="build batches ahead in this many processes (scripts/demo_prefetch.py; for a GPU); "
                         "0: in-process, the RNG stream train_state.pt replays exactly")
    ap.add_argument("--time-budget-min", type=float, default=0.0,
                    help="> 0: after 30 steps, shorten --steps (the LR schedule) to what fits this many minutes")
    ap.add_argument("--vocab", type=int, default=4096, help="BPE vocabulary incl. the 6 special tokens")
    ap.add_argument("--hidden", type=int, default=320)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=5)
    ap.add_argument("--mlp", type=int, default=864)
    ap.add_argument("--max-len", type=int, default=1024, help="context length written to config.json")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--save-minutes", type=float, default=10.0)
    ap.add_argument("--init-weights", help="start from these weights (fresh optimizer); the step comes from "
                    "the file's metadata unless --start-step is given")
    ap.add_argument("--start-step", type=int)
    ap.add_argument("--bench", type=int, default=0, help="only time this many steps (after one warm-up)")
    ap.add_argument("--corpus-cache", default=str(D.DEFAULT_CACHE))
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    train_texts, held_texts = D.load_split(Path(args.corpus_cache))

    from tokenizers import Tokenizer
    init_dir = Path(args.init_weights).parent if args.init_weights else None
    if not (model_dir / "tokenizer.json").is_file() and init_dir and (init_dir / "tokenizer.json").is_file():
        for name in ("tokenizer.json", "tokenizer_config.json"):   # a fine-tune keeps its model's ids
            (model_dir / name).write_bytes((init_dir / name).read_bytes())
    if not (model_dir / "tokenizer.json").is_file():      # trained once per run folder, on the train split
        D.train_tokenizer(train_texts, args.vocab, model_dir, args.max_len)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in D.SPECIALS}
    vocab = tok.get_vocab_size()
    cfg = tiny_config("llada", ids, args.hidden, args.layers, args.heads, args.heads, args.mlp,
                      args.max_len, vocab, "bfloat16")
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"]}))
    mask_id = cfg["mask_token_id"]
    try:
        check_template(model_dir)
    except ImportError as e:       # a bare GPU image: the template is checked wherever the server runs
        print(f"chat template not checked: {e}", flush=True)

    rows = Rows(tok, train_texts, args.seq_len, ids, args.seed)
    held = D.HeldOut(held_texts, tok)
    weights = None
    if args.task_weights:          # e.g. "add=0.3,subtract=0.3": the rest keep demo_task_rows.TASK_WEIGHTS
        from demo_task_rows import TASK_WEIGHTS
        weights = dict(TASK_WEIGHTS, **{k: float(v) for k, v in (kv.split("=") for kv in args.task_weights.split(","))})
        print(f"task weights: {weights}", flush=True)
    tasks = TaskRows(tok, train_texts, ids, args.seed, excluded_keys(), weights) if args.task_rows else None
    probe = TaskProbe(tok, ids) if args.task_rows else None
    device = torch.device(args.device)
    model = llada.LLaDAModelLM(llada.args_from_config(cfg))
    init_weights(model, args.seed, logit_scale=1.0)
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"params_M": round(n_params / 1e6, 2), "vocab": vocab,
                      "bytes_per_token_held_out": round(held.bytes_per_token, 3), "data": rows.stats}), flush=True)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    gen = torch.Generator(device).manual_seed(args.seed + 1)
    autocast = args.autocast == "bf16" or device.type == "cuda"

    def make_groups():
        """One step's rows: text and chat, plus task rows (short, or in the same tensor when long)."""
        x, maskable = rows.batch(args.batch, args.chat_share)
        groups = [(x, maskable, maskable.sum(dim=1).float())]
        if tasks is not None:
            long = tasks.rng.random() < args.task_long_share
            tx, tm, td = tasks.batch(args.task_rows, args.seq_len if long else args.task_len)
            if long:
                groups = [(torch.cat([x, tx]), torch.cat([maskable, tm]), torch.cat([groups[0][2], td]))]
            else:
                groups.append((tx, tm, td))
        return groups

    batches = None        # the prefetching loader, started once the start step is known

    rewarm_from = None         # a fresh optimizer on trained weights ramps its LR up again

    def train_step(step: int) -> float:
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        if rewarm_from is not None:
            lr *= min(1.0, (step - rewarm_from + 1) / REWARM_STEPS)
        for g in opt.param_groups:
            g["lr"] = lr
        groups = make_groups() if batches is None else next(batches)
        groups = [tuple(t.to(device, non_blocking=True) for t in g) for g in groups]
        model.train()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            n = sum(g[0].shape[0] for g in groups)      # mdm_loss is a mean over rows: weight by rows
            loss = sum(mdm_loss(model, gx, gm, mask_id, gen, denominators=gd) * (gx.shape[0] / n)
                       for gx, gm, gd in groups)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach()          # a tensor: reading it is a host sync, done every 10th step only

    if args.bench:
        times = []
        for i in range(args.bench + 1):
            t0 = time.perf_counter()
            train_step(i)
            times.append(time.perf_counter() - t0)
        tokens = args.batch * args.seq_len
        print(json.dumps({"bench": {"autocast": args.autocast, "threads": args.threads, "params_M": round(n_params / 1e6, 2),
                                    "step_s_median": round(statistics.median(times[1:]), 3),
                                    "step_s_min": round(min(times[1:]), 3),
                                    "tok_per_s_median": round(tokens / statistics.median(times[1:])),
                                    "tok_per_s_best": round(tokens / min(times[1:]))}}), flush=True)
        return

    state_file = out / "train_state.pt"
    history: list[dict] = []
    step, elapsed = 0, 0.0
    if state_file.is_file() and not args.init_weights:
        st = torch.load(state_file, weights_only=False, map_location=device)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        rows.rng.setstate(st["data_rng"])
        if tasks is not None and "task_rng" in st:
            tasks.rng.setstate(st["task_rng"])
        step, elapsed, history = st["step"], st["elapsed"], st["history"]
        print(f"resumed from {state_file} at step {step} ({elapsed / 60:.1f} min trained)", flush=True)
    elif args.init_weights:
        from safetensors import safe_open
        with safe_open(args.init_weights, "pt") as f:
            model.load_state_dict({k: f.get_tensor(k).float() for k in f.keys()})
            meta = f.metadata() or {}
        step = args.start_step if args.start_step is not None else int(meta.get("step", 0))
        if (out / "history.json").is_file():
            history = [h for h in json.loads((out / "history.json").read_text()) if h["step"] <= step]
        elapsed = history[-1]["elapsed_s"] if history else 0.0
        rewarm_from = step
        gen.manual_seed(args.seed + 1 + 7919 * step)
        rows.rng.seed(args.seed * 1_000_003 + step)
        if tasks is not None:
            tasks.rng.seed(args.seed * 1_000_033 + step)
        print(f"started from weights {args.init_weights} at step {step} (fresh optimizer)", flush=True)

    def save() -> None:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "data_rng": rows.rng.getstate(), "task_rng": tasks.rng.getstate() if tasks else None, "step": step, "elapsed": elapsed, "history": history,
                    "args": vars(args)}, out / "train_state.tmp")
        (out / "train_state.tmp").replace(state_file)
        save_weights(model, model_dir / "model.safetensors", step)
        write_json(out / "history.json", history)

    if args.data_workers:
        from demo_prefetch import prefetched
        batches = prefetched(make_groups, [rows.rng] + ([tasks.rng] if tasks else []), args.seed, step,
                             args.data_workers)
    ema = history[-1]["loss_ema"] if history else None
    budget_from = (step, time.monotonic())
    last_save = time.monotonic()
    t_report = time.monotonic()
    threads = ThreadChooser(args.threads, args.adapt_threads)
    while step < args.steps:
        t0 = time.perf_counter()
        loss = train_step(step)
        step += 1
        if args.time_budget_min and step == budget_from[0] + 30:     # past the loader's and kernels' warm-up
            budget_from = (budget_from[0], budget_from[1], time.monotonic())
        elif args.time_budget_min and step == budget_from[0] + 60:   # the rate of steps 31-60 sets the schedule
            now = time.monotonic()
            rate = (now - budget_from[2]) / 30
            left = 0.97 * (60 * args.time_budget_min - (now - budget_from[1]))    # 3 %: evaluations, snapshots
            args.steps = max(step, min(args.steps, step + int(left / rate)))
            print(f"{rate * 1000:.1f} ms a step: schedule set to {args.steps} steps", flush=True)
        dt = time.perf_counter() - t0
        elapsed += dt
        threads.observe(dt)
        if device.type != "cpu" and step % 10 and step != args.steps:
            continue                  # the loss is read (a sync) and recorded every 10th step
        loss = float(loss)
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        record = {"step": step, "loss": loss, "loss_ema": ema, "lr": lr_at(step - 1, args.steps, args.lr, args.warmup),
                  "elapsed_s": round(elapsed, 2), "wall": round(time.time()), "threads": threads.current}
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            record.update(held.figures(model, mask_id))
            print(f"step {step}: loss_ema {ema:.3f} held-out masked CE {record['held_out_ce']:.4f} nats/byte "
                  f"(ELBO bound {record['held_out_elbo']:.3f}) {elapsed / 60:.1f} min", flush=True)
            if probe is not None:
                record["tasks"] = probe.figures(model, mask_id)
                print("  first forward, right with p>=0.9 / argmax right: " + ", ".join(
                    f"{t} {f['right_p90']:.2f}/{f['argmax_right']:.2f}" for t, f in record["tasks"].items()), flush=True)
            if args.snapshot_every and step % args.snapshot_every == 0:
                (out / "snapshots").mkdir(exist_ok=True)
                save_weights(model, out / "snapshots" / f"step{step}.safetensors", step)
        elif time.monotonic() - t_report > 120:
            print(f"step {step}: loss_ema {ema:.3f} ({elapsed / step:.2f} s/step)", flush=True)
            t_report = time.monotonic()
        history.append(record)
        if time.monotonic() - last_save > 60 * args.save_minutes or step == args.steps:
            save()
            last_save = time.monotonic()
            print(f"saved step {step}", flush=True)
    final = [h for h in history if "held_out_ce" in h]
    print(json.dumps({"steps": step, "train_minutes": round(elapsed / 60, 1),
                      "final_held_out_ce": final[-1]["held_out_ce"] if final else None}), flush=True)


class ThreadChooser:
    """Keeps the faster of {1, n} torch threads, re-probed every PERIOD steps (PROBE steps each)."""
    PERIOD, PROBE = 100, 4

    def __init__(self, n: int, adapt: bool):
        self.options = (n, 1) if adapt and n > 1 else (n,)
        self.current = n
        self.k = 0
        self.times: dict[int, list[float]] = {}

    def observe(self, dt: float) -> None:
        if len(self.options) == 1:
            return
        self.times.setdefault(self.current, []).append(dt)
        self.times[self.current] = self.times[self.current][-self.PROBE:]
        self.k += 1
        if self.k % self.PERIOD == self.PERIOD - self.PROBE:          # probe the other count
            self.keep = self.current
            self._set(self.options[1] if self.current == self.options[0] else self.options[0])
        elif self.k % self.PERIOD == 0:                               # keep the faster
            other = self.current
            med = {t: statistics.median(v) for t, v in self.times.items() if len(v) == self.PROBE}
            best = min((self.keep, other), key=lambda t: med.get(t, float("inf")))
            self._set(best)

    def _set(self, n: int) -> None:
        self.current = n
        torch.set_num_threads(n)


def check_template(model_dir: Path) -> None:
    """demo_data.render_chat must equal the chat template the server applies."""
    from dllm_server.request.tokenize import Tokenizer
    hf = Tokenizer(model_dir).hf
    msgs = [("user", " Good morrow. "), ("assistant", "Hail."), ("user", "What news?")]
    want = hf.apply_chat_template([{"role": r, "content": c} for r, c in msgs], tokenize=False,
                                  add_generation_prompt=True)
    if want != D.render_chat(msgs):
        raise SystemExit(f"chat template mismatch: {want!r} != {D.render_chat(msgs)!r}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
