"""Evaluate a demo-model checkpoint the way a new user meets it: 20 fixed chat prompts
(scripts/demo_eval_prompts.txt) answered at the server's defaults, plus the held-out figure.

    python scripts/eval_demo.py                       # the embedded model (src/dllm_server/assets/demo-model)
    python scripts/eval_demo.py --model runs/demo2/model --json runs/demo2/eval.json

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint folder (default: the embedded demo model)")
    ap.add_argument("--prompts", default=str(PROMPTS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the figures and answers here")
    ap.add_argument("--threshold", type=float, help="confidence threshold per request (default: the server's)")
    args = ap.parse_args()
    r = evaluate(args.model, load_prompts(Path(args.prompts)), args.threads, args.threshold)
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
