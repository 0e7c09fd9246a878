"""Synthetic prompts (benchmarks, `dllm-server calibrate`) draw byte-range ids and shift them by
checkpoint.plain_id_offset, so they never hit a special token: no shift for byte-level
checkpoints (the recorded figures' prompts unchanged), past the specials for the demo model v2's
BPE."""
from pathlib import Path

from tokenizers import Tokenizer

from dllm_server.checkpoint import model_path, plain_id_offset_of
from dllm_server.checkpoint import plain_id_offset

DEMO_V1 = Path(__file__).resolve().parents[1] / "training" / "demo-v1"


def test_offset_is_zero_when_specials_sit_above_the_bytes():
    assert plain_id_offset(range(256, 262)) == 0           # demo v1 and the tiny checkpoints
    assert plain_id_offset([126336, 126081]) == 0          # LLaDA-8B
    assert plain_id_offset([151666, 151643, 151645]) == 0  # Dream
    assert plain_id_offset(range(6)) == 6                  # demo v2: its six specials first
    assert plain_id_offset([0, 5, 200, 300]) == 301        # the first 256-id window clear of all


def test_shifted_byte_range_ids_are_ordinary_tokens_of_every_shipped_model(tiny_llada):
    offsets = {}
    for model in (None, str(DEMO_V1), tiny_llada):
        offsets[model] = offset = plain_id_offset_of(model)
        added = set(Tokenizer.from_file(str(model_path(model) / "tokenizer.json")).get_added_tokens_decoder())
        assert len(added) >= 3, model                      # the mask, end of text, end of turn at least
        used = set(range(offset, offset + 256))            # randrange(250) .. (i % 250) + 1, shifted
        assert not used & added, (model, sorted(used & added))
    assert list(offsets.values()) == [6, 0, 0]
