"""lm-evaluation-harness generation tasks in-process through the offline `LLM`, the counterpart of
`lm_eval --model local-completions` against `dllm-server serve` (docs/evaluation.md), so the two
scores (and answers) can be compared: the same prompts, tokenized as the harness tokenizes them
(no special tokens added), the same stop sequences, seed and greedy default.

    python scripts/lm_eval_offline.py --model GSAI-ML/LLaDA-8B-Instruct --tasks gsm8k --num_fewshot 5 \\
        --config device=cuda --config dtype=bfloat16

Loglikelihood (multiple-choice) tasks are refused: a diffusion model has no left-to-right
log-probabilities (docs/evaluation.md).
"""
from __future__ import annotations

import argparse
import json

try:
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table
except ImportError as exc:          # an optional extra: say which
    raise SystemExit(f"lm_eval_offline.py needs lm-evaluation-harness ({exc}): "
                     "pip install -e '.[eval]' (lm-eval[api]==0.4.13)") from None

from dllm_server import LLM, SamplingParams

HARNESS_SEED = 1234      # what TemplateAPI sends with every request


class OfflineLM(LM):
    def __init__(self, model: str | None = None, **config):
        super().__init__()
        self.llm = LLM(model, **config)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        prompts, params = [], []
        for context, gen_kwargs in (r.args for r in requests):
            kw = dict(gen_kwargs)
            until = kw.get("until") or None
            prompts.append({"prompt_token_ids": self.llm.tokenizer.encode(context, add_special_tokens=False)})
            params.append(SamplingParams(**{**self.llm.sampling_defaults,
                                            "max_tokens": int(kw.get("max_gen_toks", 256)),
                                            "temperature": float(kw.get("temperature", 0.0)),
                                            "stop": [until] if isinstance(until, str) else until,
                                            "seed": HARNESS_SEED}))
        return [o.text for o in self.llm.generate(prompts, params, use_tqdm=not disable_tqdm)]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("loglikelihood tasks need left-to-right log-probabilities, which a diffusion "
                                  "model does not have: use generation tasks (docs/evaluation.md)")

    loglikelihood_rolling = loglikelihood

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        return self.llm.tokenizer.hf.apply_chat_template(chat_history, tokenize=False,
                                                         add_generation_prompt=add_generation_prompt)

    @property
    def tokenizer_name(self) -> str:
        return str(self.llm.path)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.llm.tokenizer.hf.chat_template


def evaluate(model: str | None, tasks: list[str], include_path: str | None = None, config: dict | None = None,
             **kwargs) -> dict:
    return simple_evaluate(model=OfflineLM(model, **(config or {})), tasks=tasks,
                           task_manager=TaskManager(include_path=include_path), **kwargs)


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="checkpoint folder or model id (default: the demo model)")
    p.add_argument("--tasks", required=True, help="comma-separated generation tasks")
    p.add_argument("--num_fewshot", type=int, default=None)
    p.add_argument("--limit", type=float, default=None)
    p.add_argument("--include_path", default=None, help="folder of extra task YAML files")
    p.add_argument("--apply_chat_template", action="store_true")
    p.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE",
                   help="a ServerConfig field for the offline engine (repeatable), e.g. block_length=32")
    ns = p.parse_args(argv)
    config = {k: _value(v) for k, v in (c.split("=", 1) for c in ns.config)}
    results = evaluate(ns.model, ns.tasks.split(","), ns.include_path, config, num_fewshot=ns.num_fewshot,
                       limit=ns.limit, apply_chat_template=ns.apply_chat_template, log_samples=False)
    print(make_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
