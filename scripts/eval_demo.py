"""Evaluate a demo-model checkpoint the way a new user meets it: 20 fixed chat prompts
(scripts/demo_eval_prompts.txt) answered at the server's defaults, plus the held-out figure.

    python scripts/eval_demo.py                       # the embedded model (src/dllm_server/assets/demo-model)
    python scripts/eval_demo.py --model runs/demo2/model --json runs/demo2/eval.json
    python scripts/eval_demo.py --tasks               # also the demo tasks at every threshold (v3)

The request is what a client sending only `messages` gets: the sampling parameters come from the
server's own request model (api.protocol.ChatCompletionRequest with the config's
default_chat_max_tokens), and the engine from a default ServerConfig (block length, threshold,
cache mode, dtype), through the offline `LLM` (the same WorkerCore the server runs), one
torch thread as a worker on the 2-core machine gets. Figures printed:

- median answer length in words (words: runs of letters with inner apostrophes);
- distinct answers of 20 (exact text);
- English words: share of the answers' words found in a word list from the PyPI package
  `english-words` 2.0.2 (MIT): the union of its `web2` list (Webster's Second International,
  public domain, as shipped in BSD's /usr/share/dict) and its `gcide` list (GNU Collaborative
  International Dictionary of English 0.53, GPL-3.0-or-later), lower-cased letters only. A word
  also counts when a plain English inflection of a listed word (-s, -es, -ies, -ed, -d, -ing,
  -eth, -est, -st, -er, -ly, doubled consonants) or, for a word with apostrophes, every piece
  (o'er, 'tis, is't, lov'd) is known. Shakespeare's own held-out speeches score about 98 %.
- positions committed per forward: every denoised position (padding included) over forwards,
  summed over the 20 answers;
- held-out masked cross-entropy, nats per byte, and LLaDA's ELBO bound (demo_data.HeldOut; the
  model in float32).

With `--tasks` (the shipped evaluation set, dllm_server/assets/eval/demo_tasks.jsonl, or a file
of the same records) it also answers every task question greedily with max_tokens 64 at each of
the thresholds 0.99, 0.95, 0.9, 0.7, 0.5 and 0.3 (`--task-thresholds`), and reports per task and
threshold: exact match (demo_tasks.is_correct: whitespace-normalised equality), forwards per
answer, answer tokens per forward (the answer's tokens, padding and end of turn not counted, over
forwards) and positions per forward (every committed position, padding included); "copied" and
"computed" pool copy/reverse/count/lookup and add/subtract/sort, "all" the seven; macro exact
match is the mean over tasks.

Needs the `serve` and `demo-eval` extras (pydantic; english-words).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_data as D  # noqa: E402

PROMPTS = Path(__file__).resolve().parent / "demo_eval_prompts.txt"
SUFFIXES = [("ies", "y"), ("ied", "y"), ("ier", "y"), ("iest", "y"), ("es", ""), ("s", ""), ("ed", ""),
            ("ed", "e"), ("d", ""), ("ing", ""), ("ing", "e"), ("eth", ""), ("eth", "e"), ("est", ""),
            ("est", "e"), ("st", ""), ("er", ""), ("er", "e"), ("ly", ""), ("n", "")]
PIECES = {"s", "t", "d", "ll", "st", "th", "o", "i", "a", "en", "ve", "re"}   # 's 't 'd 'll o' i' ...


def load_prompts(path: Path = PROMPTS) -> list[str]:
    lines = [l.strip() for l in path.read_text().splitlines()]
    return [l for l in lines if l and not l.startswith("#")]


class EnglishWords:
    def __init__(self):
        from english_words import get_english_words_set
        self.words = get_english_words_set(["web2", "gcide"], lower=True, alpha=True)

    def _known(self, w: str) -> bool:
        if w in self.words:
            return True
        for suf, add in SUFFIXES:
            if w.endswith(suf) and len(w) - len(suf) >= 2:
                stem = w[: -len(suf)] + add
                if stem in self.words:
                    return True
                if suf in ("ed", "ing", "est", "er", "eth") and len(stem) > 2 and stem[-1] == stem[-2] \
                        and stem[:-1] in self.words:
                    return True
        return False

    def __contains__(self, word: str) -> bool:
        w = word.lower()
        if w.endswith("'d"):
            w = w[:-2] + "ed"
        return self._known(w) or all(p in PIECES or self._known(p) for p in w.split("'") if p)


def evaluate(model: str | None, prompts: list[str], threads: int = 1, threshold: float | None = None) -> dict:
    """The figures at the server's defaults; `threshold` overrides the confidence threshold per
    request (as a client's `threshold` field would)."""
    from dllm_server import LLM
    from dllm_server.api.protocol import ChatCompletionRequest
    from dllm_server.checkpoint import model_path
    from dllm_server.model.loader import load_model
    from tokenizers import Tokenizer

    torch.set_num_threads(threads)
    llm = LLM(model)
    requests = [ChatCompletionRequest(messages=[{"role": "user", "content": p}], threshold=threshold) for p in prompts]
    params = [r.sampling_params(llm.config.default_chat_max_tokens) for r in requests]
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
    answers = [o.text.strip() for o in outs]
    words = [D.WORD.findall(a) for a in answers]
    english = EnglishWords()
    all_words = [w for ws in words for w in ws]
    path = model_path(model)
    net, args, _ = load_model(path, "float32", "cpu")
    held = D.HeldOut(D.load_split()[1], Tokenizer.from_file(str(Path(path) / "tokenizer.json")))
    figures = held.figures(net, args.mask_id)
    p0 = params[0]
    return {
        "model": str(path),
        "defaults": {"max_tokens": p0.max_tokens, "temperature": p0.temperature,
                     "block_length": llm.config.block_length,
                     "threshold": llm.config.threshold if threshold is None else threshold,
                     "cache": llm.config.cache, "dtype": str(next(llm.runner.model.parameters()).dtype).removeprefix("torch.")},
        "median_answer_words": statistics.median(len(ws) for ws in words),
        "distinct_answers": len(set(answers)),
        "num_prompts": len(prompts),
        "english_word_share": sum(w in english for w in all_words) / max(1, len(all_words)),
        "positions_per_forward": sum(o.stats.num_committed for o in outs) / max(1, sum(o.stats.num_forwards for o in outs)),
        "held_out_ce_nats_per_byte": figures["held_out_ce"],
        "held_out_elbo_nats_per_byte": figures["held_out_elbo"],
        "bytes_per_token_held_out": held.bytes_per_token,
        "answers": [{"prompt": p, "answer": a, "words": len(ws), "forwards": o.stats.num_forwards,
                     "committed": o.stats.num_committed, "finish": o.finish_reason}
                    for p, a, ws, o in zip(prompts, answers, words, outs)],
    }


TASK_THRESHOLDS = (0.99, 0.95, 0.9, 0.7, 0.5, 0.3)


def task_figures(outs, items) -> dict:
    """Pooled figures of a set of answers to demo-task items."""
    from dllm_server.demo_tasks import is_correct
    forwards = sum(o.stats.num_forwards for o in outs)
    return {"n": len(items), "exact_match": sum(is_correct(o.text, i.answer) for o, i in zip(outs, items)) / len(items),
            "forwards_per_answer": forwards / len(items),
            "answer_tokens_per_forward": sum(len(o.token_ids) for o in outs) / max(1, forwards),
            "positions_per_forward": sum(o.stats.num_committed for o in outs) / max(1, forwards)}


def evaluate_tasks(model: str | None, items, thresholds=TASK_THRESHOLDS, threads: int = 1,
                   max_tokens: int = 64, **llm_kwargs) -> dict:
    """{threshold: {task | copied | computed | all: figures}, "macro_exact_match": ...}; answers kept.
    `llm_kwargs`: ServerConfig fields for the offline LLM (enforce_eager=True on a GPU, say)."""
    from dllm_server import LLM, SamplingParams
    from dllm_server.demo_tasks import COMPUTED, COPIED, TASKS

    torch.set_num_threads(threads)
    llm = LLM(model, **llm_kwargs)
    convs = [[{"role": "user", "content": i.question}] for i in items]
    result = {"model": str(llm.path), "max_tokens": max_tokens, "thresholds": {}}
    for tau in thresholds:
        outs = llm.chat(convs, SamplingParams(max_tokens=max_tokens, temperature=0.0, threshold=tau))
        groups = {t: [k for k, i in enumerate(items) if i.task == t] for t in TASKS}
        groups = {t: ks for t, ks in groups.items() if ks}
        groups["copied"] = [k for k, i in enumerate(items) if i.task in COPIED]
        groups["computed"] = [k for k, i in enumerate(items) if i.task in COMPUTED]
        groups["all"] = list(range(len(items)))
        figs = {g: task_figures([outs[k] for k in ks], [items[k] for k in ks]) for g, ks in groups.items() if ks}
        figs["macro_exact_match"] = sum(figs[t]["exact_match"] for t in TASKS if t in figs) / \
            sum(1 for t in TASKS if t in figs)
        figs["answers"] = [{"task": i.task, "question": i.question, "reference": i.answer, "answer": o.text,
                            "forwards": o.stats.num_forwards} for i, o in zip(items, outs)]
        result["thresholds"][str(tau)] = figs
    return result


def print_tasks(r: dict) -> None:
    from dllm_server.demo_tasks import TASKS
    taus = list(r["thresholds"])
    print(f"\ndemo tasks, greedy, max_tokens {r['max_tokens']}: {r['model']}\n")
    for fig, name, fmt in (("exact_match", "exact match (%)", lambda v: f"{100 * v:.0f}"),
                           ("forwards_per_answer", "forwards per answer", lambda v: f"{v:.1f}"),
                           ("answer_tokens_per_forward", "answer tokens per forward", lambda v: f"{v:.2f}"),
                           ("positions_per_forward", "positions per forward (padding counted)", lambda v: f"{v:.2f}")):
        print(f"| {name} | " + " | ".join(f"tau {t}" for t in taus) + " |")
        print("|---|" + "---|" * len(taus))
        for g in [t for t in TASKS if t in r["thresholds"][taus[0]]] + ["copied", "computed", "all"]:
            print(f"| {g} | " + " | ".join(fmt(r["thresholds"][t][g][fig]) for t in taus) + " |")
        if fig == "exact_match":
            print("| macro over tasks | " + " | ".join(f"{100 * r['thresholds'][t]['macro_exact_match']:.1f}"
                                                    for t in taus) + " |")
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint folder (default: the embedded demo model)")
    ap.add_argument("--prompts", default=str(PROMPTS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the figures and answers here")
    ap.add_argument("--threshold", type=float, help="confidence threshold per request (default: the server's)")
    ap.add_argument("--tasks", nargs="?", const="", default=None,
                    help="also the demo tasks (default file: the shipped evaluation set)")
    ap.add_argument("--task-thresholds", type=float, nargs="+", default=list(TASK_THRESHOLDS))
    ap.add_argument("--per-task", type=int, help="only the first N items of each task")
    ap.add_argument("--no-chat", action="store_true", help="skip the chat figures (tasks only)")
    args = ap.parse_args()
    tasks = None
    if args.tasks is not None:
        from dllm_server.demo_tasks import load_eval
        items = load_eval(args.tasks or None, per_task=args.per_task)
        tasks = evaluate_tasks(args.model, items, tuple(args.task_thresholds), args.threads)
        print_tasks(tasks)
    if args.no_chat:
        if args.json:
            Path(args.json).write_text(json.dumps({"tasks": tasks}, indent=2))
        return
    r = evaluate(args.model, load_prompts(Path(args.prompts)), args.threads, args.threshold)
    r["tasks"] = tasks
    print(f"model: {r['model']}")
    print("defaults:", ", ".join(f"{k} {v}" for k, v in r["defaults"].items()))
    print()
    print("| prompt | answer | words | forwards | committed / forward |")
    print("|---|---|---|---|---|")
    for a in r["answers"]:
        shown = re.sub(r"\s+", " ", a["answer"]).replace("|", "\\|")
        print(f"| {a['prompt']} | {shown} | {a['words']} | {a['forwards']} | {a['committed'] / max(1, a['forwards']):.2f} |")
    print()
    print("| figure | value |")
    print("|---|---|")
    print(f"| median answer length (words) | {r['median_answer_words']:g} |")
    print(f"| distinct answers | {r['distinct_answers']} of {r['num_prompts']} |")
    print(f"| English words | {100 * r['english_word_share']:.1f} % |")
    print(f"| positions committed per forward | {r['positions_per_forward']:.2f} |")
    print(f"| held-out masked cross-entropy (nats/byte) | {r['held_out_ce_nats_per_byte']:.3f} |")
    print(f"| held-out ELBO bound (nats/byte) | {r['held_out_elbo_nats_per_byte']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
