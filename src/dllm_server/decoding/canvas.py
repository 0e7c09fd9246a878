"""Pure canvas geometry: canvas = prompt + answer, answer rounded up to whole blocks.

Positions are absolute canvas indices everywhere (RoPE and the KV cache depend on it).
"""
from __future__ import annotations


def answer_len(max_tokens: int, block_len: int) -> int:
    return -(-max_tokens // block_len) * block_len


def num_blocks(max_tokens: int, block_len: int) -> int:
    return -(-max_tokens // block_len)


def block_bounds(prompt_len: int, block_index: int, block_len: int) -> tuple[int, int]:
    start = prompt_len + block_index * block_len
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


def effective_steps(steps: int, max_tokens: int, block_len: int) -> int:
    """A request's `steps` as the engine runs it: at least one forward per block, at most one per
    answer position (more would commit nothing), so every schema-valid value means something."""
    return min(max(steps, num_blocks(max_tokens, block_len)), answer_len(max_tokens, block_len))
