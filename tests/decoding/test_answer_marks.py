"""AnswerMarks (decoding/stop.py), the worker's incremental stop rule, against the rule written
out on the canvas tensor (what worker/core.py computed per row before): masked answer positions,
block still open, visible length and finality agree after every write, including writes a commit
rule never makes (a position overwritten, a mask or a stop token written back)."""
import random

import torch

from dllm_server.decoding.stop import AnswerMarks

MASK, EOS, EOT = 9, 2, 3


def oracle(canvas: torch.Tensor, prompt_len: int, stops: tuple, max_tokens: int, ignore_eos: bool,
           start: int, end: int) -> tuple[int, bool, int, bool]:
    answer = canvas[prompt_len:]
    n = min(max_tokens, answer.numel())
    if not ignore_eos and stops:
        hits = torch.isin(answer[:max_tokens], torch.tensor(stops)).nonzero()
        if hits.numel():
            n = int(hits[0, 0])
    return (int((answer == MASK).sum()), bool((canvas[start:end] == MASK).any()), n,
            not bool((answer[:n] == MASK).any()))


def test_marks_agree_with_the_tensor_rule_under_random_writes():
    rng = random.Random(0)
    for case in range(300):
        prompt_len, block, n_blocks = rng.randint(0, 6), rng.choice((1, 4, 8)), rng.randint(1, 4)
        answer = [MASK] * (block * n_blocks)
        for i in range(len(answer)):            # some earlier blocks already committed (a re-prefill)
            if rng.random() < 0.3:
                answer[i] = rng.choice((5, 6, EOS, EOT))
        canvas = torch.tensor([rng.choice((1, MASK, EOS)) for _ in range(prompt_len)] + answer)
        stops = rng.choice(((EOS,), (EOS, EOT), ()))
        ignore_eos = rng.random() < 0.2
        max_tokens = rng.randint(1, len(answer))
        marks = AnswerMarks(canvas, prompt_len, MASK, stops, ignore_eos)
        for _ in range(12):
            b = rng.randrange(n_blocks)
            start, end = prompt_len + b * block, prompt_len + (b + 1) * block
            cols = sorted(rng.sample(range(block), rng.randint(0, block)))
            values = [rng.choice((5, 6, 7, EOS, EOT, MASK)) for _ in cols]
            expect = canvas.clone()
            expect[[start + c for c in cols]] = torch.tensor(values, dtype=canvas.dtype)
            positions = marks.commit(start, cols, values)
            assert positions == tuple(start + c for c in cols)
            assert torch.equal(canvas, expect)                      # the tensor itself was written
            masked, open_, n, final = oracle(canvas, prompt_len, stops, max_tokens, ignore_eos, start, end)
            assert marks.num_masked == masked, case
            assert marks.any_masked(start, end) == open_, case
            assert marks.visible_len(max_tokens) == n, case
            assert marks.is_final(max_tokens) == final, case
