"""Pure canvas geometry: canvas = prompt + answer, answer rounded up to whole blocks.

Positions are absolute canvas indices everywhere (RoPE and the KV cache depend on it). Two grids
(the one seam between model families):
- relative (LLaDA, Dream): blocks start at the prompt's end; the answer is max_tokens rounded up
  to whole blocks;
- absolute (`absolute=True`: block-causal families, SDAR): blocks lie on the grid from position
  0, the model's own (its attention mask is defined on it), so the prompt's last partial block is
  the first answer block's fixed part, and the canvas ends on a block boundary.
"""
from __future__ import annotations


def first_block_start(prompt_len: int, block_len: int, absolute: bool = False) -> int:
    return (prompt_len // block_len) * block_len if absolute else prompt_len


def answer_len(max_tokens: int, block_len: int, prompt_len: int = 0, absolute: bool = False) -> int:
    if absolute:
        return -(-(prompt_len + max_tokens) // block_len) * block_len - prompt_len
    return -(-max_tokens // block_len) * block_len


def num_blocks(max_tokens: int, block_len: int, prompt_len: int = 0, absolute: bool = False) -> int:
    if absolute:
        return -(-(prompt_len + max_tokens) // block_len) - prompt_len // block_len
    return -(-max_tokens // block_len)


def block_bounds(prompt_len: int, block_index: int, block_len: int, absolute: bool = False) -> tuple[int, int]:
    start = first_block_start(prompt_len, block_len, absolute) + block_index * block_len
    return start, start + block_len


def steps_per_block(steps: int, n_blocks: int, block_index: int) -> int:
    """Split `steps` (over the whole answer, as LLaDA's generate; effective_steps first) across
    blocks; earlier blocks take the remainder so the total is exactly `steps`."""
    base, extra = divmod(steps, n_blocks)
    return base + (1 if block_index < extra else 0)


def transfer_counts(num_masked: int, num_steps: int) -> list[int]:
    """LLaDA's linear schedule: commits per step, differing by at most one, larger first."""
    base, extra = divmod(num_masked, num_steps)
    return [base + (1 if i < extra else 0) for i in range(num_steps)]


def effective_steps(steps: int, max_tokens: int, block_len: int, prompt_len: int = 0, absolute: bool = False) -> int:
    """A request's `steps` as the engine runs it: at least one forward per block, at most one per
    answer position (more would commit nothing), so every schema-valid value means something."""
    return min(max(steps, num_blocks(max_tokens, block_len, prompt_len, absolute)),
               answer_len(max_tokens, block_len, prompt_len, absolute))
