"""The SDAR no-cache references (sdar_reference.py) behave, on the tiny seeded sdar checkpoint:
the plain loop follows the contract's commit schedule and is deterministic, several positions
commit in one forward, diffusers' LLaDA2Pipeline driving stock Qwen3 agrees with it token for
token wherever their semantics coincide (and the known differences are real), and the stop rule
cuts the answer at the first stop token. 20 prompts of 3-13 byte tokens (every P % 4 occurs, so
the shared partial prompt block and canvas tails past max_tokens are both exercised)."""
import functools

import pytest
import torch

from . import sdar_reference as ref

pytest.importorskip("transformers")
B, MAX_TOKENS, EOS, MASK = 4, 12, 256, 259
RULES = {"t0.9": {"threshold": 0.9}, "t0.5": {"threshold": 0.5},
         "s4": {"steps_per_block": 4}, "s2": {"steps_per_block": 2}}


def _prompts(n: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    lengths = torch.randint(3, 14, (n,), generator=g).tolist()
    return [torch.randint(0, 256, (k,), generator=g).tolist() for k in lengths]


PROMPTS = _prompts()


@functools.lru_cache(maxsize=None)
def _plain(folder: str, rule: str, i: int, schedule_over: str = "masked", stops: tuple = ()):
    trace: list = []
    out = ref.reference_generate_plain(folder, PROMPTS[i], MAX_TOKENS, stop_ids=stops, schedule_over=schedule_over,
                                       trace=trace, **RULES[rule])
    return out, trace


def _diffusers(folder: str, rule: str, i: int, stops: tuple = (), **kw):
    trace: list = []
    out = ref.reference_generate(folder, PROMPTS[i], MAX_TOKENS, stop_ids=stops, trace=trace, **RULES[rule], **kw)
    return out, trace


def test_prompts_cover_every_partial_block():
    assert {len(p) % B for p in PROMPTS} == {0, 1, 2, 3}
    assert all(3 <= len(p) <= 13 and max(p) < EOS for p in PROMPTS)


def test_geometry_from_the_checkpoint(tiny_sdar):
    assert ref.block_geometry(tiny_sdar) == (B, MASK, frozenset({EOS}))


def test_the_mask_reaching_stock_qwen3_is_block_causal(tiny_sdar):
    """A token changed in block 3 leaves blocks 0-2's logits bit-identical and changes the
    logits of block 3's earlier positions (bidirectional inside the block)."""
    model = ref.load_stock(tiny_sdar)
    x = torch.tensor([PROMPTS[0][:3] * 6])[:, :16]
    pos = torch.arange(16)
    mask = ref.block_causal_additive(pos, B, torch.float32)
    with torch.no_grad():
        a = model(input_ids=x, attention_mask=mask, position_ids=pos[None]).logits[0]
        y = x.clone()
        y[0, 15] = (y[0, 15] + 1) % 256
        b = model(input_ids=y, attention_mask=mask, position_ids=pos[None]).logits[0]
    assert torch.equal(a[:12], b[:12])
    assert (a[12] - b[12]).abs().max() > 1e-3


@pytest.mark.parametrize("rule", RULES)
def test_plain_loop_follows_the_contract_and_is_deterministic(tiny_sdar, rule):
    forwards, multi, blocks = 0, 0, 0
    for i, prompt in enumerate(PROMPTS):
        out, trace = _plain(tiny_sdar, rule, i)
        again: list = []
        assert ref.reference_generate_plain(tiny_sdar, prompt, MAX_TOKENS, stop_ids=(), trace=again,
                                            **RULES[rule]) == out
        assert again == trace
        p = len(prompt)
        assert len(out) == MAX_TOKENS and MASK not in out
        assert len(trace) == -(-(p + MAX_TOKENS) // B) - p // B            # every answer block decoded
        for b, commits in enumerate(trace):
            m = B - p % B if b == 0 else B                                     # masked count of the block
            assert sum(commits) == m and min(commits) >= 1
            steps = RULES[rule].get("steps_per_block")
            if steps is not None:                                              # the linear schedule over m
                want, left = [], m
                for c in ref.linear_schedule(m, steps):
                    if left:
                        want.append(min(max(c, 1), left))
                        left -= want[-1]
                assert commits == want
            else:
                assert len(commits) <= m
        forwards += sum(map(len, trace))
        multi += sum(c > 1 for commits in trace for c in commits)
        blocks += len(trace)
    print(f"\n{rule}: {forwards} forwards over {blocks} blocks ({forwards / blocks:.2f} per block), "
          f"{multi} forwards committed more than one position")
    if rule != "s4":
        assert multi > 0


@pytest.mark.parametrize("rule", RULES)
def test_diffusers_pipeline_agrees_with_the_plain_loop(tiny_sdar, rule):
    """Token for token wherever `diffusers_coincides` (all 20 prompts but steps_per_block 2 with
    P % 4 == 2); for fixed steps also with the plain loop on diffusers' block_size schedule, for
    every prompt. Same commits per block; diffusers adds one no-mask forward per block that ends
    before its step cap."""
    pytest.importorskip("diffusers")
    steps = RULES[rule].get("steps_per_block")
    same, differ, ours_f, theirs_f = 0, 0, 0, 0
    for i, prompt in enumerate(PROMPTS):
        ours, trace = _plain(tiny_sdar, rule, i)
        theirs, their_trace = _diffusers(tiny_sdar, rule, i)
        ours_f += sum(map(len, trace))
        theirs_f += sum(map(len, their_trace))
        assert [sum(c) for c in their_trace] == [sum(c) for c in trace]
        if ref.diffusers_coincides(len(prompt), MAX_TOKENS, B, steps):
            assert theirs == ours, (i, prompt)
            assert [[c for c in cs if c] for cs in their_trace] == trace
            same += 1
        else:
            assert steps == 2 and len(prompt) % B == 2
            assert their_trace[0][0] == 2 and trace[0] == [1, 1]     # 2 masks: diffusers commits both at once
            differ += theirs != ours
        if steps is not None:
            assert theirs == _plain(tiny_sdar, rule, i, schedule_over="block")[0], (i, prompt)
    print(f"\n{rule}: {same}/{len(PROMPTS)} prompts where the semantics coincide, all identical; "
          f"{differ} of the others' answers differ; forwards: plain {ours_f}, diffusers {theirs_f}")
    assert same == len(PROMPTS) - (4 if rule == "s2" else 0)


def test_the_block_length_schedule_changes_some_answers(tiny_sdar):
    """The one semantic difference left, made visible: with steps_per_block 2 and P % 4 == 2 the
    first answer block has 2 masks; the contract commits 1 + 1 (two forwards), diffusers and
    SDAR's generate.py 2 at once. Among seeded such prompts one soon decodes differently."""
    pytest.importorskip("diffusers")
    g = torch.Generator().manual_seed(5)
    for tried in range(1, 41):
        prompt = torch.randint(0, 256, (6,), generator=g).tolist()
        ours = ref.reference_generate_plain(tiny_sdar, prompt, 6, steps_per_block=2, stop_ids=())
        theirs = ref.reference_generate(tiny_sdar, prompt, 6, steps_per_block=2, stop_ids=())
        assert theirs == ref.reference_generate_plain(tiny_sdar, prompt, 6, steps_per_block=2, stop_ids=(),
                                                      schedule_over="block")
        if theirs != ours:
            break
    print(f"\nfirst different answer after {tried} prompts: {ours} vs diffusers {theirs}")
    assert theirs != ours


def test_honouring_the_pipelines_tail_padding_changes_answers_off_the_grid(tiny_sdar):
    """diffusers' 2-D mask zeroes the canvas tail past P + max_tokens; taken as key padding it
    still agrees when the canvas ends exactly at P + max_tokens, and differs for some others
    (the contract attends the tail's masks, as SDAR's generate does)."""
    pytest.importorskip("diffusers")
    differ = 0
    for i, prompt in enumerate(PROMPTS):
        theirs, _ = _diffusers(tiny_sdar, "t0.9", i, honour_tail_padding=True)
        ours = _plain(tiny_sdar, "t0.9", i)[0]
        if ref.diffusers_coincides(len(prompt), MAX_TOKENS, B, honour_tail_padding=True):
            assert theirs == ours
        else:
            differ += theirs != ours
    print(f"\nhonoured tail padding: {differ} answers differ")
    assert differ > 0


@pytest.mark.parametrize("rule", ["t0.9", "s2"])
def test_stop_tokens_cut_the_answer(tiny_sdar, rule):
    """Stop id = the answer's token at index 6: the answer is the unstopped one cut before that
    token's first occurrence, in fewer forwards when that is before the last block. diffusers
    agrees both when it early-stops on that id and when its one eos id (256) never appears."""
    pytest.importorskip("diffusers")
    saved = 0
    for i, prompt in enumerate(PROMPTS):
        full, trace = _plain(tiny_sdar, rule, i)
        stop = full[6]
        want = full[:full.index(stop)]
        for stops in ((stop,), (stop, EOS)):
            got, stop_trace = _plain(tiny_sdar, rule, i, stops=stops)
            assert got == want
            assert stop_trace == trace[:len(stop_trace)]
            saved += sum(map(len, trace)) - sum(map(len, stop_trace))
            if ref.diffusers_coincides(len(prompt), MAX_TOKENS, B, RULES[rule].get("steps_per_block")):
                assert _diffusers(tiny_sdar, rule, i, stops=stops)[0] == want
    print(f"\n{rule}: stops saved {saved} forwards")
    assert saved > 0
