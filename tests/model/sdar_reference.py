"""No-cache reference decoding for SDAR (block-causal Qwen3), the oracle the engine's SDAR
decoding is checked against. Both references drive stock `transformers.Qwen3ForCausalLM`
(loaded from the checkpoint folder unchanged) with full forwards over [0, end of the current
block) and an explicit 4-D block-causal mask (query block >= key block); nothing here imports
dllm_server.

Semantics (the engine's contract; the plain loop implements exactly this):
- canvas: prompt + masks, canvas_len = ceil((P + max_tokens) / B) * B, blocks on the absolute
  grid from position 0. The prompt's last partial block is the first answer block's fixed part;
  complete prompt blocks are never decoded. The canvas tail past P + max_tokens is ordinary
  masked positions (attended and decoded like any other, then dropped), as in SDAR's and
  LLaDA2's published `generate`, which apply no padding mask.
- one step = one full forward over [0, block end); proposals are greedy argmax with the mask
  token banned (its logit -inf before the softmax); confidence = softmax probability of the
  proposal, untempered, computed in float64 over the banned-mask distribution.
- commit (inside the current block, masked positions only):
  threshold t: every position with confidence >= t, at least the most confident one;
  steps_per_block s: LLaDA's linear schedule over the block's *masked* count m (m split into s
  counts differing by at most one, larger first; a 0 count still commits one, so a block takes
  min(s, m) forwards), the most confident positions committed. Ties go to the lower position.
- stop: after a block, if any stop token lies in the answer so far (nothing is masked in a
  finished block, so it is "committed with nothing masked before it"), decoding ends. The answer
  is canvas[P : P + max_tokens] cut before its first stop token.

`reference_generate_plain` is that loop (our transcription of SDAR's / LLaDA2's no-cache
`generate`). `reference_generate` runs the same decoding through diffusers 0.42.1's
`LLaDA2Pipeline` + `BlockRefinementScheduler`; `diffusers_coincides` says when the two must
agree token for token. Engine tests use the plain loop as the oracle; the pipeline is its
cross-check (tests/model/test_sdar_reference.py). diffusers is not a declared dependency: the
pipeline's mask contract changed between releases (an older one passed a 4-D 1/0 mask), so
this is written against 0.42.1 and the tests skip without diffusers.

What the diffusers pipeline needs (all keyword arguments of `LLaDA2Pipeline.__call__`):
- model: any nn.Module with a `.device` and a forward(input_ids, attention_mask=2-D, position_ids)
  returning an object with `.logits` [1, W, V]; `BlockCausalAdapter` below turns the 2-D mask
  into the 4-D additive block-causal mask for stock Qwen3 and bans the mask token's logit
  (the pipeline itself would propose and "commit" the mask id). tokenizer=None is fine.
- input_ids=[1, P] int64, gen_length=max_tokens, block_length=B, mask_token_id (from config.json;
  required without a tokenizer), output_type="seq".
- greedy: temperature=0.0, sampling_method="greedy"; editing off: editing_threshold=None;
  minimal_topk=1.
- threshold t: num_inference_steps=B (schedule of 1 per step: "all above t, else the best one")
  and threshold = the float32 just below t (the scheduler tests `conf > t` in float32, the
  contract `>=`).
- fixed steps s: num_inference_steps=s and threshold=2.0 (> 1 forces the pure top-k schedule).
- stop: eos_early_stop=True with eos_token_id = one stop id (it takes only one: the folder's eos
  when among the stop ids, else the smallest); the answer is then cut at the first of all stop
  ids here.

How the pipeline differs (read from pipeline_llada2.py / scheduling_block_refinement.py 0.42.1):
1. Canvas: the same absolute grid, the partial prompt block shared, the window re-run from 0
   every step with no cache. But its 2-D mask zeroes the tail past P + gen_length; honoured as
   key padding (`honour_tail_padding=True`) the tail is invisible to every query, unlike SDAR's
   generate and the contract. The adapter ignores it by default.
2. Fixed-steps schedule: split over block_length, clamped to what is masked, not over the
   masked count: it differs in the partial first block (e.g. B 4, s 2, P % 4 == 2: it commits
   2 in one forward where the contract commits 1 + 1). SDAR's own generate.py does the same.
   `schedule_over="block"` makes the plain loop follow it, for a full cross-check.
3. num_inference_steps is capped at gen_length // minimal_topk: with max_tokens < B (threshold)
   or < s (fixed) the schedule, and hence the fallback count, changes.
4. Confidence is float32 (softmax of logits.float()), and `>` on the float32 threshold: the
   threshold decision can differ only for a confidence within a float32 ulp of t.
5. Stop: it stops inside the block at the step that commits EOS with nothing masked before the
   first EOS (later positions stay masks), and only for one EOS id; it checks only on steps that
   commit an EOS. None of this changes the answer (no editing: a committed token is final), only
   the forward count. It also runs one extra forward per block when the last commit happens
   before the step cap (the pass that finds no mask left; harmless). An EOS id inside the prompt
   disables its early stop (it looks at the first EOS of the whole window).
Under token editing (`edit_threshold`; its early stop is turned off here, since it would end a
block before its edits, which LLaDA2.1's own generate never does):
6. Its step cap (num_inference_steps, counted over forwards that found a mask) also ends a block
   whose masks took exactly that many forwards to fill, before any post-edit forward (LLaDA2.1's
   generate has no cap): a fully masked block filled one position per forward gets no editing
   pass after its last fill.
7. Its post-edit budget is checked after the forward, so it runs max_post_steps + 1 forwards with
   no mask left where LLaDA2.1's generate runs max_post_steps (checked before the forward).
`reference_generate_plain(..., pipeline_quirks=True)` follows 6 and 7 (with max_tokens >= the
block); with them the plain loop and the pipeline agree token for token.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable

import numpy as np
import torch


def load_stock(folder: str, dtype: torch.dtype = torch.float32):
    """Stock Qwen3ForCausalLM from the SDAR folder (model_type "sdar" only warns), eval mode;
    loaded once per (folder, dtype)."""
    return _load_stock(str(folder), dtype)


@functools.lru_cache(maxsize=4)
def _load_stock(folder: str, dtype: torch.dtype):
    if "LLaDA2MoeModelLM" in json.loads((Path(folder) / "config.json").read_text()).get("architectures", []):
        from .llada2_reference import ReferenceLLaDA2        # stock transformers parts (llada2_reference.py)
        return ReferenceLLaDA2(folder, dtype)
    from transformers import Qwen3ForCausalLM
    return Qwen3ForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").eval()


def block_geometry(folder: str) -> tuple[int, int, frozenset[int]]:
    """(block_size, mask_token_id, default stop ids: the eos ids of config.json and
    generation_config.json) from the checkpoint folder."""
    cfg = json.loads((Path(folder) / "config.json").read_text())
    stops: set[int] = set()
    gen = Path(folder) / "generation_config.json"
    for c in (cfg, json.loads(gen.read_text()) if gen.exists() else {}):
        eos = c.get("eos_token_id")
        stops.update([] if eos is None else eos if isinstance(eos, list) else [eos])
    return int(cfg.get("block_size", 32)), _mask_id(Path(folder), cfg), frozenset(stops)


def _mask_id(folder: Path, cfg: dict) -> int:
    """config.json's mask_token_id, else the id of the tokenizer's mask_token (LLaDA2 names it only there);
    LLaDA2's released config states no block_size either (32)."""
    if "mask_token_id" in cfg:
        return int(cfg["mask_token_id"])
    name = json.loads((folder / "tokenizer_config.json").read_text())["mask_token"]
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    return next(t["id"] for t in added if t["content"] == name)


def block_causal_additive(positions: torch.Tensor, block: int, dtype: torch.dtype,
                          key_valid: torch.Tensor | None = None) -> torch.Tensor:
    """[1, 1, W, W] additive mask: 0 where query block >= key block (and the key is valid),
    the dtype's minimum elsewhere."""
    blk = positions // block
    allowed = blk[:, None] >= blk[None, :]
    if key_valid is not None:
        allowed = allowed & key_valid[None, :]
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def linear_schedule(num_masked: int, steps: int) -> list[int]:
    """LLaDA's linear schedule: `num_masked` commits over `steps`, differing by at most one, larger first."""
    base, extra = divmod(num_masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def _answer(tokens: list[int], max_tokens: int, stops: Iterable[int]) -> list[int]:
    ans = tokens[:max_tokens]
    cut = min([ans.index(s) for s in stops if s in ans], default=len(ans))
    return ans[:cut]


def _check_rule(threshold, steps_per_block) -> None:
    if (threshold is None) == (steps_per_block is None):
        raise ValueError("give exactly one of threshold and steps_per_block")
    if steps_per_block is not None and steps_per_block < 1:
        raise ValueError("steps_per_block must be >= 1")


def reference_generate_plain(folder: str, prompt_ids: list[int], max_tokens: int, threshold: float | None = None,
                             steps_per_block: int | None = None, stop_ids: Iterable[int] | None = None, *,
                             dtype: torch.dtype = torch.float32, schedule_over: str = "masked",
                             trace: list | None = None, edit_threshold: float | None = None,
                             max_post_edit_steps: int = 16, edits: list | None = None,
                             pipeline_quirks: bool = False) -> list[int]:
    """The contract above, as a plain loop. `stop_ids` None: the folder's eos ids; () for none.
    `schedule_over="block"`: the fixed schedule over block_size (diffusers / SDAR generate.py)
    instead of the masked count. `trace`, if given, receives one list per decoded block: the
    number of positions each forward committed.

    `edit_threshold` (LLaDA2.1's token editing): on every forward, a filled answer position of the
    block (filled before that forward) whose proposal differs from its token with confidence >= the
    edit threshold takes the proposal; the block goes on after its masks are filled and ends at
    the first forward that found no mask and edited nothing, or before a forward that would be the
    (`max_post_edit_steps` + 1)-th with no mask (LLaDA2.1's published generate). `edits`, if
    given, receives (position, from, to) per edit. `pipeline_quirks`: diffusers' two departures
    under editing (module docstring, 6 and 7), for a full cross-check."""
    _check_rule(threshold, steps_per_block)
    if schedule_over not in ("masked", "block"):
        raise ValueError(f"schedule_over: 'masked' or 'block', got {schedule_over!r}")
    folder = str(folder)
    model = load_stock(folder, dtype)
    block, mask_id, default_stops = block_geometry(folder)
    stops = default_stops if stop_ids is None else frozenset(stop_ids)
    p = len(prompt_ids)
    length = -(-(p + max_tokens) // block) * block
    x = torch.full((length,), mask_id, dtype=torch.int64)
    x[:p] = torch.tensor(prompt_ids, dtype=torch.int64)
    positions = torch.arange(length)
    mask = block_causal_additive(positions, block, dtype)
    for b in range(p // block, length // block):
        start, end = b * block, (b + 1) * block
        masked = x[start:end] == mask_id
        if steps_per_block is not None:
            schedule = linear_schedule(int(masked.sum()) if schedule_over == "masked" else block, steps_per_block)
        commits, step, post = [], 0, 0
        budget = max_post_edit_steps + (1 if pipeline_quirks else 0)
        step_cap = min(block if steps_per_block is None else steps_per_block, max_tokens)
        while True:
            had_masks = bool(masked.any())
            if not had_masks:
                if edit_threshold is None:
                    break
                post += 1
                if post > budget:
                    break
            filled = ~masked & (torch.arange(start, end) >= p)
            with torch.no_grad():
                logits = model(input_ids=x[None, :end], attention_mask=mask[..., :end, :end],
                               position_ids=positions[None, :end]).logits[0, start:end].to(torch.float64)
            logits[:, mask_id] = float("-inf")
            tokens = logits.argmax(dim=-1)
            prob = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1).exp()
            edit = torch.zeros_like(filled)
            if edit_threshold is not None:
                edit = filled & (tokens != x[start:end]) & (prob >= edit_threshold)
            if had_masks:
                conf = torch.where(masked, prob, torch.full_like(prob, float("-inf")))
                if steps_per_block is not None:
                    k = schedule[min(step, len(schedule) - 1)]
                else:
                    k = int((conf >= threshold).sum())
                k = min(max(k, 1), int(masked.sum()))
                chosen = torch.sort(conf, descending=True, stable=True).indices[:k]
                x[start + chosen] = tokens[chosen]
                masked[chosen] = False
                commits.append(k)
                step += 1
            if edits is not None:
                edits += [(start + int(i), int(x[start + i]), int(tokens[i])) for i in edit.nonzero()[:, 0]]
            x[start:end][edit] = tokens[edit]
            if not had_masks and not edit.any():
                break
            if pipeline_quirks and had_masks and step >= step_cap:
                break
        if trace is not None:
            trace.append(commits)
        if any(t in stops for t in x[p:end].tolist()):
            break
    return _answer(x[p:].tolist(), max_tokens, stops)


def diffusers_coincides(prompt_len: int, max_tokens: int, block: int, steps_per_block: int | None = None,
                        honour_tail_padding: bool = False) -> bool:
    """Whether `reference_generate` implements the contract exactly for this request shape
    (up to float32 confidence ties): differences 1-3 of the module docstring are absent."""
    steps = block if steps_per_block is None else steps_per_block
    if max_tokens < steps:
        return False
    if honour_tail_padding and (prompt_len + max_tokens) % block:
        return False
    m = block - prompt_len % block                # masked count of the first answer block
    ours = np.cumsum([max(c, 1) for c in linear_schedule(m, steps)])
    theirs = np.cumsum(linear_schedule(block, steps))
    return bool((np.minimum(ours, m) == np.minimum(theirs, m)).all())


class BlockCausalAdapter(torch.nn.Module):
    """What LLaDA2Pipeline calls as its model: stock Qwen3 with the 4-D block-causal mask built
    from the pipeline's position ids; the mask token's logit set to -inf (never proposed).
    `honour_tail_padding`: also drop keys where the pipeline's 2-D mask is 0 (its zeroed canvas
    tail). Counts forwards."""

    def __init__(self, model, block: int, mask_id: int, honour_tail_padding: bool = False):
        super().__init__()
        self.model, self.block, self.mask_id = model, block, mask_id
        self.honour_tail_padding = honour_tail_padding
        self.forwards = 0

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        assert input_ids.shape[0] == 1, "one sequence at a time"
        pos = position_ids[0]
        valid = attention_mask[0].bool() if self.honour_tail_padding and attention_mask is not None else None
        mask = block_causal_additive(pos, self.block, self.model.dtype, valid)
        self.forwards += 1
        logits = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits.clone()
        logits[..., self.mask_id] = float("-inf")
        return SimpleNamespace(logits=logits)


def reference_generate(folder: str, prompt_ids: list[int], max_tokens: int, threshold: float | None = None,
                       steps_per_block: int | None = None, stop_ids: Iterable[int] | None = None, *,
                       dtype: torch.dtype = torch.float32, honour_tail_padding: bool = False,
                       trace: list | None = None, edit_threshold: float | None = None,
                       max_post_edit_steps: int = 16) -> list[int]:
    """The same decoding through diffusers' LLaDA2Pipeline (see the module docstring for the
    arguments and for where it departs from the contract: `diffusers_coincides`). `trace`, if
    given, receives one list per decoded block: positions committed by each forward
    (including the pipeline's extra no-mask pass, which commits 0)."""
    from diffusers import BlockRefinementScheduler, LLaDA2Pipeline
    _check_rule(threshold, steps_per_block)
    folder = str(folder)
    block, mask_id, default_stops = block_geometry(folder)
    stops = default_stops if stop_ids is None else frozenset(stop_ids)
    adapter = BlockCausalAdapter(load_stock(folder, dtype), block, mask_id, honour_tail_padding)
    pipe = LLaDA2Pipeline(model=adapter, scheduler=BlockRefinementScheduler(block_length=block), tokenizer=None)
    pipe.set_progress_bar_config(disable=True)
    if threshold is not None:
        steps = block
        below = float(np.nextafter(np.float32(threshold), np.float32(-np.inf)))  # conf > below  <=>  conf >= t
    else:
        steps, below = steps_per_block, 2.0
    eos = min(stops & default_stops or stops) if stops else None     # the pipeline takes one id: the folder's eos first
    editing = None
    if edit_threshold is not None:      # `>` in float32 as for the threshold; its EOS early stop would end a block
        editing = float(np.nextafter(np.float32(edit_threshold), np.float32(-np.inf)))   # before its edits: off

    def record(_pipe, _global_step, step_idx, kwargs):
        if trace is not None:
            if step_idx == 0:
                trace.append([])
            trace[-1].append(int(kwargs["transfer_index"].sum()))
        return {}

    out = pipe(input_ids=torch.tensor([prompt_ids], dtype=torch.int64), gen_length=max_tokens, block_length=block,
               num_inference_steps=steps, temperature=0.0, sampling_method="greedy", threshold=below,
               editing_threshold=editing, max_post_steps=max_post_edit_steps, minimal_topk=1,
               eos_early_stop=eos is not None and editing is None, eos_token_id=eos,
               mask_token_id=mask_id, output_type="seq", callback_on_step_end=record,
               callback_on_step_end_tensor_inputs=["transfer_index"])
    return _answer(out.sequences[0].tolist(), max_tokens, stops)
