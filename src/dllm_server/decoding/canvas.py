"""Canvas geometry (prompt + answer in whole blocks, absolute positions). Blocks start at the prompt's end (LLaDA,
Dream) or, with `absolute=True` (block-causal SDAR), lie on the model's grid from position 0."""
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
    """Split the answer's `steps` across blocks (as LLaDA's generate); earlier blocks take the remainder."""
    base, extra = divmod(steps, n_blocks)
    return base + (1 if block_index < extra else 0)


def transfer_counts(num_masked: int, num_steps: int) -> list[int]:
    """LLaDA's linear schedule: commits per step, differing by at most one, larger first."""
    base, extra = divmod(num_masked, num_steps)
    return [base + (1 if i < extra else 0) for i in range(num_steps)]


def effective_steps(steps: int, max_tokens: int, block_len: int, prompt_len: int = 0, absolute: bool = False) -> int:
    """`steps` as run: at least one forward per block, at most one per answer position."""
    return min(max(steps, num_blocks(max_tokens, block_len, prompt_len, absolute)),
               answer_len(max_tokens, block_len, prompt_len, absolute))
