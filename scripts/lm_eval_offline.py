"""lm-evaluation-harness generation tasks in-process through the offline `LLM`, the counterpart of
`lm_eval --model local-completions` / `local-chat-completions --apply_chat_template` against
`dllm-server serve` (docs/evaluation.md), so the two scores (and answers) can be compared. Each
request becomes the body the harness would send (lm_eval/models/openai_completions.py
`_create_payload`: `max_tokens`, `temperature`, `stop`, seed 1234 and every other generation
kwarg, e.g. `--gen_kwargs threshold=0.7`), read by the server's own request model
(api/protocol.py) into SamplingParams: the same fields honoured, unknown ones ignored. Plain
prompts are tokenized as the harness tokenizes them (no special tokens added); with
`--apply_chat_template` the harness' messages go through the model's chat template as the server's
chat route applies it.

    python scripts/lm_eval_offline.py --model GSAI-ML/LLaDA-8B-Instruct --tasks gsm8k --num_fewshot 5 \\
        --config device=cuda --config dtype=bfloat16
    python scripts/lm_eval_offline.py --tasks dllm_demo --apply_chat_template --gen_kwargs threshold=0.9 \\
        --include_path "$(python -c 'from dllm_server.demo_tasks import lm_eval_task_dir; print(lm_eval_task_dir())')"

Loglikelihood (multiple-choice) tasks are refused: a diffusion model has no left-to-right
log-probabilities (docs/evaluation.md).
"""
from __future__ import annotations

import argparse
import json
import logging

try:
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.models.api_models import JsonChatStr
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table
except ImportError as exc:          # an optional extra: say which
    raise SystemExit(f"lm_eval_offline.py needs lm-evaluation-harness ({exc}): "
                     "pip install -e '.[eval]' (lm-eval[api]==0.4.13)") from None

from dllm_server import LLM
from dllm_server.api.protocol import ChatCompletionRequest, DiffusionFields

HARNESS_SEED = 1234      # what TemplateAPI sends with every request
HARNESS_MAX_GEN_TOKS = 256
CHAT_MAX_STOPS = 4       # local-chat-completions sends the first four stop sequences only
log = logging.getLogger("lm_eval_offline")


def request_body(gen_kwargs: dict, chat: bool) -> dict:
    """The sampling part of the body `local-(chat-)completions` sends for one generate_until
    request (lm_eval/models/openai_completions.py `_create_payload`): what it maps, then every
    other generation kwarg as given."""
    kw = dict(gen_kwargs)
    kw.pop("do_sample", None)
    max_tokens = kw.pop("max_tokens") if "max_tokens" in kw else kw.pop("max_gen_toks", HARNESS_MAX_GEN_TOKS)
    temperature = kw.pop("temperature", 0)
    until = kw.pop("until", None)
    stop = [until] if isinstance(until, str) else list(until or [])
    return {"max_tokens": max_tokens, "temperature": temperature, "stop": stop[:CHAT_MAX_STOPS] if chat else stop,
            "seed": HARNESS_SEED, **kw}


class OfflineLM(LM):
    def __init__(self, model: str | None = None, **config):
        super().__init__()
        self.llm = LLM(model, **config)

    def _request(self, context, gen_kwargs: dict):
        """(prompt, SamplingParams, ignored fields) of one request, read by the server's request
        models from JSON, so a field is honoured, ignored or refused exactly as the server does."""
        body = request_body(gen_kwargs, chat=isinstance(context, JsonChatStr))
        if isinstance(context, JsonChatStr):
            req = ChatCompletionRequest.model_validate_json(json.dumps({"messages": json.loads(context.prompt),
                                                                        **body}))
            ids = self.llm.tokenizer.apply_chat_template([m.as_template_message() for m in req.messages])
        else:
            req = DiffusionFields.model_validate_json(json.dumps(body))
            ids = self.llm.tokenizer.encode(context, add_special_tokens=False)
        params = req.sampling_params(HARNESS_MAX_GEN_TOKS, self.llm.sampling_defaults)
        return {"prompt_token_ids": ids}, params, req.ignored_fields()

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        if not requests:
            return []
        prompts, params, ignored = zip(*(self._request(*r.args[:2]) for r in requests))
        if any(ignored):
            log.warning("ignoring unknown request fields, as the server does: %s",
                        ", ".join(sorted(set().union(*ignored))))
        return [o.text for o in self.llm.generate(list(prompts), list(params), use_tqdm=not disable_tqdm)]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("loglikelihood tasks need left-to-right log-probabilities, which a diffusion "
                                  "model does not have: use generation tasks (docs/evaluation.md)")

    loglikelihood_rolling = loglikelihood

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> JsonChatStr:
        """The messages themselves, as TemplateAPI keeps them for a chat endpoint: the chat
        template is applied in generate_until, as the server's chat route applies it (always with
        the generation prompt)."""
        return JsonChatStr(json.dumps(chat_history, ensure_ascii=False))

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
    p.add_argument("--gen_kwargs", default=None, help="generation kwargs over the tasks' own, as lm_eval's "
                   "(e.g. threshold=0.9,block_length=32): every field the server's request body accepts")
    p.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE",
                   help="a ServerConfig field for the offline engine (repeatable), e.g. block_length=32")
    ns = p.parse_args(argv)
    config = {k: _value(v) for k, v in (c.split("=", 1) for c in ns.config)}
    results = evaluate(ns.model, ns.tasks.split(","), ns.include_path, config, num_fewshot=ns.num_fewshot,
                       limit=ns.limit, apply_chat_template=ns.apply_chat_template, gen_kwargs=ns.gen_kwargs,
                       log_samples=False)
    print(make_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
