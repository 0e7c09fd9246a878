"""Offline engine API, like vLLM's `LLM`: the server's Scheduler and one in-process WorkerCore taking turns as a
worker process does. Only the transport differs (a list for a pipe), so offline and served answers agree."""
from __future__ import annotations

import itertools
import time
from typing import Any, Sequence

import torch

from .checkpoint import architecture_of, model_path, read_config, request_defaults
from .config import ServerConfig, TestHooks
from .costmodel.worker_speed import WorkerLoadModel
from .decoding.params import SamplingParams, request_seed
from .structured.grammars import Grammars
from .devices import resolve_device
from .messages import WorkerReady
from .policy import make_policy
from .policy.base import DecodePolicy
from .request.events import STREAM_NONE
from .request.inputs import check_request, prompt_ids
from .request.state import GenerationOutput, RequestState
from .request.tokenize import Tokenizer, stop_token_ids
from .scheduler.request_table import Entry
from .scheduler.scheduler import Scheduler
from .worker.build import build_core, startup_profile
from .worker.turn import take_turn


class _Collect:
    """A request's event sink offline: only its final output is kept."""
    __slots__ = ("done", "request_id")

    def __init__(self, done: dict, request_id: str):
        self.done, self.request_id = done, request_id

    def put_nowait(self, event) -> None:
        if event.output is not None:
            self.done[self.request_id] = event.output


class LLM:
    def __init__(self, model: str | None = None, policy: DecodePolicy | None = None, hooks: TestHooks | None = None,
                 **config_kwargs: Any):
        self.config = ServerConfig(model=model, **config_kwargs)
        if self.config.tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size: the offline LLM runs one process; tensor-parallel instances run "
                             "in `dllm-server serve` (docs/parallelism.md)")
        self.path = model_path(self.config.model, self.config.revision, self.config.download_dir)
        architecture_of(read_config(self.path), self.config.model or str(self.path))
        self.generation_config, self.sampling_defaults = request_defaults(self.path, self.config.generation_config)
        self.device = torch.device(resolve_device(self.config.device))
        self.core, self.model_info = build_core(self.config.worker_config(hooks), str(self.path), self.device)
        self.runner = self.core.stepper.runner
        self.args = self.core.stepper.args
        self.tokenizer = None if self.config.skip_tokenizer_init else Tokenizer(self.path)
        self.stop_ids = stop_token_ids(self.generation_config, self.model_info.eos_id, self.tokenizer)
        self.grammars = Grammars(str(self.path), self.stop_ids, self.model_info.vocab_size)
        load = WorkerLoadModel(self.config.block_length)
        self.policy = policy or make_policy(self.config.replace(placement="colocated", num_workers=1), self.path,
                                            load)
        self.scheduler = Scheduler(self.config.replace(placement="colocated", num_workers=1), ["colocated"],
                                   self.tokenizer, self._send, self.policy, load=load)
        self._inbox: list = []
        self._iterations = 0
        ready = WorkerReady(0, self.core.pool.num_pages, self.core.pool.page_size, self.model_info,
                            startup_profile(self.core, self.model_info))
        self.scheduler.on_messages(0, [ready])
        self.scheduler.tick()
        self._arrivals = itertools.count()

    def generate(self, prompts: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[GenerationOutput]:
        if not isinstance(prompts, (list, tuple)):
            prompts = [prompts]
        pairs = [prompt_ids(p, self.tokenizer) for p in prompts]
        return self._run(pairs, sampling_params, use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = False) -> list[GenerationOutput]:
        if self.tokenizer is None:
            raise ValueError("messages: chat needs a tokenizer (skip_tokenizer_init is set)")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        pairs = [(None, self.tokenizer.apply_chat_template(list(c))) for c in conversations]
        return self._run(pairs, sampling_params, use_tqdm)

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (vLLM's rule)."""
        return SamplingParams(**self.sampling_defaults)

    def _send(self, worker_id: int, msg) -> None:
        self._inbox.append(msg)

    def _turn(self) -> None:
        msgs, self._inbox = self._inbox, []
        t0 = time.perf_counter()
        out, self._iterations = take_turn(self.core, msgs, 0, self._iterations, lambda _: time.perf_counter() - t0)
        if out:
            self.scheduler.on_messages(0, out)
        self.scheduler.tick()

    def _run(self, pairs, sampling_params, use_tqdm: bool) -> list[GenerationOutput]:
        params_list = self._params_list(sampling_params, len(pairs))
        states = [self._state(text, ids, params) for (text, ids), params in zip(pairs, params_list)]
        done: dict[str, GenerationOutput] = {}
        for st in states:
            self.scheduler.add(Entry(st, _Collect(done, st.request_id), STREAM_NONE, time.monotonic()))
        self.scheduler.tick()
        bar = None
        if use_tqdm:
            from tqdm import tqdm
            bar = tqdm(total=len(states), desc="generate", unit="req")
        while len(done) < len(states) or self._inbox:
            if not self._inbox and not self.core.has_work:
                raise RuntimeError("engine stalled with unfinished requests")
            self._turn()
            if bar is not None:
                bar.update(len(done) - bar.n)
        if bar is not None:
            bar.close()
        return [done[st.request_id] for st in states]

    def _state(self, text: str | None, ids: list[int], params: SamplingParams) -> RequestState:
        seq = next(self._arrivals)
        resolved = params.resolve(self.config.block_length, request_seed(self.config.seed, seq),
                                  self.model_info.block_size)
        check_request(ids, params, resolved, self.model_info)
        resolved = self.grammars.constrain(params, resolved)
        st = RequestState(f"offline-{seq}", text, ids, params, resolved, self.model_info.mask_id, self.stop_ids, seq,
                          self.tokenizer.decode if self.tokenizer is not None else None)
        workers = self.scheduler.workers
        if workers.pages_for(st.prompt_len + st.answer_len) > workers.min_capacity_pages():
            raise ValueError(f"max_tokens: a canvas of {st.prompt_len + st.answer_len} tokens needs "
                             f"{workers.pages_for(st.prompt_len + st.answer_len)} KV pages; the worker holds "
                             f"{workers.min_capacity_pages()}")
        return st

    def _params_list(self, sampling_params, n: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.get_default_sampling_params()] * n
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * n
        sampling_params = list(sampling_params)
        if len(sampling_params) != n:
            raise ValueError(f"sampling_params: {len(sampling_params)} given for {n} prompts")
        return sampling_params
