"""Certainty forcing for the demo model: fine-tune a trained checkpoint on its own answers so that
it grows confident along its own decoding trajectory (after dParallel, arXiv 2509.26488). A
model that is sure of what it will write anyway lets threshold 0.9 commit several positions per
forward; the pretrained demo model commits about one (scripts/eval_demo.py).

1. Teacher rows: --teacher-cues single-turn cues of the training split (distinct, shuffled with
   the seed; the 20 evaluation prompts are left out) answered by the starting checkpoint itself
   at the server's defaults (offline LLM: greedy, block 32, threshold 0.9, dual cache, float32),
   laid out as chat rows: prompt, answer, <|eot_id|>, <|endoftext|> padding to --seq-len.
   Written once to <out>/teacher.pt.
2. Fine-tune with LLaDA's masked loss (train_demo.mdm_loss) on batches of teacher rows
   (--teacher-share) and the pretraining mix (text windows and chat rows, --chat-share of the
   rest, which keeps the held-out figure from drifting), plus --certainty times the mean entropy
   of the masked teacher positions the model already predicts right.

Every --eval-every steps it writes <out>/model/ and runs scripts/eval_demo.py's figures on it
(history.json). Resumable like train_demo.py: rerun the same command; <out>/train_state.pt holds
the model, optimizer, RNG states and history.

    python scripts/distill_demo.py --init runs/demo2/model --out runs/distill --steps 400
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_data as D  # noqa: E402
import eval_demo as E  # noqa: E402
import train_demo as T  # noqa: E402

from dllm_server.model import llada  # noqa: E402

COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def teacher_rows(init: Path, train_texts: list[str], n: int, seq_len: int, seed: int, ids: dict[str, int],
                 threads: int, temperature: float = 0.0, max_per_answer: int = 0) -> dict:
    """The starting checkpoint's own answers to n training cues, as chat rows (see the docstring);
    sampled at `temperature` (0: greedy, the server's default) and at most `max_per_answer` rows
    with the same answer text (0: no cap), so a few stock answers cannot dominate the rows."""
    from dllm_server import LLM
    from dllm_server.api.protocol import ChatCompletionRequest
    held = {p.lower() for p in E.load_prompts()}
    cues = sorted({c.messages[0][1] for c in D.chat_examples(train_texts)
                   if len(c.messages) == 1 and c.messages[0][1].lower() not in held})
    cues = D.shuffled(cues, seed)[:n]
    torch.set_num_threads(threads)
    llm = LLM(str(init), dtype="float32")
    params = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], temperature=temperature).sampling_params(
        llm.config.default_chat_max_tokens)
    t0 = time.perf_counter()
    outs = llm.chat([[{"role": "user", "content": c}] for c in cues], params, use_tqdm=True)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(init / "tokenizer.json"))
    prompts = tok.encode_batch([D.render_chat([("user", c)]) for c in cues])
    rows, starts, kept, seen = [], [], [], {}
    eot, eos = ids["<|eot_id|>"], ids["<|endoftext|>"]
    for c, p, o in zip(cues, prompts, outs):
        ans = list(o.token_ids)
        if o.finish_reason != "stop" or len(p.ids) + len(ans) + 1 > seq_len:
            continue
        text = o.text.strip()
        seen[text] = seen.get(text, 0) + 1
        if max_per_answer and seen[text] > max_per_answer:
            continue
        rows.append(p.ids + ans + [eot] + [eos] * (seq_len - len(p.ids) - len(ans) - 1))
        starts.append(len(p.ids))
        kept.append((c, o.text.strip()))
    stats = {"cues": len(cues), "rows": len(rows), "distinct_answers": len({a for _, a in kept}),
             "generate_s": round(time.perf_counter() - t0, 1),
             "positions_per_forward": sum(o.stats.num_committed for o in outs) / max(1, sum(o.stats.num_forwards for o in outs))}
    if not rows:
        raise SystemExit("teacher: no answer ended within --seq-len; nothing to distil")
    return {"rows": torch.tensor(rows, dtype=torch.int64), "starts": torch.tensor(starts, dtype=torch.int64),
            "samples": kept[:20], "stats": stats}


def evaluate_here(model, out: Path, init: Path, step: int, threads: int) -> dict:
    """Write <out>/model/ and return eval_demo's figures for it (answers left out)."""
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        if (init / name).is_file():
            shutil.copy(init / name, model_dir / name)
    T.save_weights(model, model_dir / "model.safetensors", step)
    r = E.evaluate(str(model_dir), E.load_prompts(), threads)
    torch.set_num_threads(threads)
    keys = ("median_answer_words", "distinct_answers", "english_word_share", "positions_per_forward",
            "held_out_ce_nats_per_byte")
    return {k: r[k] for k in keys} | {"sample": r["answers"][2]["answer"]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", required=True, help="the trained checkpoint's HF folder (config, tokenizer, weights)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--teacher-cues", type=int, default=4096)
    ap.add_argument("--teacher-share", type=float, default=0.5, help="share of each batch that is teacher rows")
    ap.add_argument("--chat-share", type=float, default=0.5, help="share of the rest that is pretraining chat rows")
    ap.add_argument("--certainty", type=float, default=0.5, help="weight of the entropy term (0: plain self-distillation)")
    ap.add_argument("--teacher-temperature", type=float, default=0.0, help="sample the teacher's answers (0: greedy)")
    ap.add_argument("--max-per-answer", type=int, default=0, help="teacher rows kept per distinct answer (0: all)")
    ap.add_argument("--certainty-on-chat", action="store_true",
                    help="the entropy term also on the pretraining chat rows (real replies)")
    ap.add_argument("--certainty-on-end", action="store_true",
                    help="the entropy term only where the target is <|eot_id|> or <|endoftext|> padding")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=192)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--adapt-threads", action="store_true", help="as train_demo.py")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--save-minutes", type=float, default=10.0)
    ap.add_argument("--corpus-cache", default=str(D.DEFAULT_CACHE))
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    init, out = Path(args.init), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train_texts, _ = D.load_split(Path(args.corpus_cache))
    from safetensors import safe_open
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(init / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in D.SPECIALS}
    cfg = json.loads((init / "config.json").read_text())
    mask_id = cfg["mask_token_id"]

    teacher_file = out / "teacher.pt"
    made_by = {k: getattr(args, k) for k in ("init", "teacher_cues", "seq_len", "seed", "teacher_temperature",
                                              "max_per_answer")}
    if args.teacher_share > 0 and not teacher_file.is_file():
        t = teacher_rows(init, train_texts, args.teacher_cues, args.seq_len, args.seed, ids, args.threads,
                         args.teacher_temperature, args.max_per_answer)
        torch.save(t | {"made_by": made_by}, teacher_file)
    teacher = (torch.load(teacher_file) if args.teacher_share > 0 else
               {"rows": torch.zeros(0, args.seq_len, dtype=torch.int64), "starts": torch.zeros(0, dtype=torch.int64),
                "samples": [], "stats": {}})
    if teacher.get("made_by", made_by) != made_by:
        raise SystemExit(f"{teacher_file} was made with {teacher['made_by']}, not {made_by}: use another --out")
    print(json.dumps({"teacher": teacher["stats"], "samples": teacher["samples"][:5]}), flush=True)
    torch.set_num_threads(args.threads)

    rows = T.Rows(tok, train_texts, args.seq_len, ids, args.seed)
    model = llada.LLaDAModelLM(llada.args_from_config(cfg))
    with safe_open(str(init / "model.safetensors"), "pt") as f:
        model.load_state_dict({k: f.get_tensor(k).float() for k in f.keys()})
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed + 1)
    pick = torch.Generator().manual_seed(args.seed + 2)
    state_file = out / "train_state.pt"
    step, history = 0, []
    if state_file.is_file():
        st = torch.load(state_file, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        pick.set_state(st["pick"])
        rows.rng.setstate(st["data_rng"])
        step, history = st["step"], st["history"]
        print(f"resumed from {state_file} at step {step}", flush=True)
    else:
        history.append({"step": 0} | evaluate_here(model, out, init, 0, args.threads))
        print(json.dumps(history[-1]), flush=True)

    def save() -> None:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "pick": pick.get_state(), "data_rng": rows.rng.getstate(), "step": step,
                    "history": history, "args": vars(args)}, out / "train_state.tmp")
        (out / "train_state.tmp").replace(state_file)
        T.write_json(out / "history.json", history)

    end_ids = torch.tensor([ids["<|eot_id|>"], ids["<|endoftext|>"]]) if args.certainty_on_end else None
    n_teacher = round(args.batch * args.teacher_share)
    starts = teacher["starts"]
    threads = T.ThreadChooser(args.threads, args.adapt_threads)
    last_save, ema = time.monotonic(), None
    while step < args.steps:
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = T.lr_at(step, args.steps, args.lr, args.warmup)
        x, maskable = rows.batch(args.batch - n_teacher, args.chat_share)
        if n_teacher:
            j = torch.randint(len(starts), (n_teacher,), generator=pick)
            tm = torch.arange(args.seq_len)[None, :] >= starts[j][:, None]
            x, maskable = torch.cat([x, teacher["rows"][j]]), torch.cat([maskable, tm])
        n_rest = args.batch - n_teacher       # Rows.batch: text windows first, then its chat rows
        first = n_rest - round(n_rest * args.chat_share) if args.certainty_on_chat else n_rest
        certain = torch.arange(args.batch) >= first
        model.train()
        loss = T.mdm_loss(model, x, maskable, mask_id, gen, args.certainty, certain, end_ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        dt = time.perf_counter() - t0
        threads.observe(dt)
        value = loss.item()
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        record = {"step": step, "loss": value, "loss_ema": ema, "step_s": round(dt, 2)}
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            record |= evaluate_here(model, out, init, step, threads.current)
            print(json.dumps(record), flush=True)
        history.append(record)
        if time.monotonic() - last_save > 60 * args.save_minutes or step == args.steps:
            save()
            last_save = time.monotonic()
    print(json.dumps({"steps": step, "final": history[-1]}), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
