"""Offline engine API, like vLLM's `LLM`: in-process continuous batching over one WorkerCore.

    from dllm_server import LLM, SamplingParams
    llm = LLM(model="path/to/checkpoint")
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=64))

Re-implements no decoding or admission: it feeds SubmitBlocks to the same core a worker process
runs (built by the same worker/build.py), advances requests with the same RequestState and
engine/output.advance the server uses, and asks the same per-block decode policy. With one core
the router always keeps a request where it is, so every block continues in place.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import torch

from .checkpoint import architecture_of, model_path, read_config, request_defaults
from .config import ServerConfig
from .decoding.params import BlockPolicy, SamplingParams, request_seed
from .devices import resolve_device
from .request.inputs import check_request, prompt_ids
from .request.output import advance
from .policy import make_policy
from .policy.base import DecodePolicy
from .request.state import GenerationOutput, RequestState
from .request.tokenize import Tokenizer, stop_token_ids
from .messages import Abort, ContinueBlock
from .worker.build import build_core


class LLM:
    def __init__(self, model: str | None = None, policy: DecodePolicy | None = None, **config_kwargs: Any):
        self.config = ServerConfig(model=model, **config_kwargs)
        if self.config.tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size: the offline LLM runs one process; tensor-parallel instances run "
                             "in `dllm-server serve` (docs/parallelism.md)")
        self.path = model_path(self.config.model, self.config.revision, self.config.download_dir)
        architecture_of(read_config(self.path), self.config.model or str(self.path))
        self.generation_config, self.sampling_defaults = request_defaults(self.path, self.config.generation_config)
        self.device = torch.device(resolve_device(self.config.device))
        self.core, self.model_info = build_core(self.config.worker_config(), str(self.path), self.device)
        self.runner = self.core.stepper.runner        # the model and its forward (benchmarks, tests)
        self.args = self.core.stepper.args
        self.tokenizer = None if self.config.skip_tokenizer_init else Tokenizer(self.path)
        self.stop_ids = stop_token_ids(self.generation_config, self.model_info.eos_id, self.tokenizer)
        self.policy = policy or make_policy(self.config, self.path)
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

    # ---- the in-process loop ----
    def _run(self, pairs, sampling_params, use_tqdm: bool) -> list[GenerationOutput]:
        params_list = self._params_list(sampling_params, len(pairs))
        states: dict[str, RequestState] = {}
        order = []
        decode = self.tokenizer.decode if self.tokenizer is not None else None
        for (text, ids), params in zip(pairs, params_list):   # validate everything before running
            seq = next(self._arrivals)
            resolved = params.resolve(self.config.block_length, request_seed(self.config.seed, seq), self.model_info.block_size)
            check_request(ids, params, resolved, self.model_info)
            rid = f"offline-{seq}"
            states[rid] = RequestState(rid, text, ids, params, resolved, self.model_info.mask_id, self.stop_ids, seq,
                                       decode)
            order.append(rid)
        done: dict[str, GenerationOutput] = {}
        for rid in order:
            self._submit(states[rid], states, done)
        bar = None
        if use_tqdm:
            from tqdm import tqdm
            bar = tqdm(total=len(order), desc="generate", unit="req")
        while len(done) < len(order):
            if not self.core.has_work:
                raise RuntimeError("engine stalled with unfinished requests")   # a bug, never expected
            for msg in self.core.step():
                self._handle(msg, states, done)
            if bar is not None:
                bar.update(len(done) - bar.n)
        if bar is not None:
            bar.close()
        return [done[rid] for rid in order]

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (vLLM's rule): what a
        call without sampling_params uses."""
        return SamplingParams(**self.sampling_defaults)

    def _params_list(self, sampling_params, n: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.get_default_sampling_params()] * n
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * n
        sampling_params = list(sampling_params)
        if len(sampling_params) != n:
            raise ValueError(f"sampling_params: {len(sampling_params)} given for {n} prompts")
        return sampling_params

    def _lease(self, st: RequestState) -> BlockPolicy | None:
        nxt = st.block_index + 1
        return self.policy.block_policy(st, nxt) if nxt < st.num_blocks else None

    def _submit(self, st: RequestState, states: dict[str, RequestState], done: dict) -> None:
        block = st.submit_msg(self.policy.block_policy(st, st.block_index), self._lease(st))
        for msg in self.core.submit(block):
            self._handle(msg, states, done)

    def _handle(self, msg, states: dict[str, RequestState], done: dict) -> None:
        st = states.get(msg.request_id)
        if st is None or msg.request_id in done:
            return
        outcome = advance(st, msg)
        if outcome.abort_worker:
            self.core.abort(Abort(st.request_id))
        if outcome.output is not None:
            done[st.request_id] = outcome.output
        elif outcome.continued:
            then = self._lease(st)
            if then is not None:
                self.core.continue_block(ContinueBlock(st.request_id, st.block_index, then))
        elif outcome.next_block:
            self._submit(st, states, done)
