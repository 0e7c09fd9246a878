"""HF checkpoint folder -> model: architecture, (sharded) safetensors, dtype, errors naming what is missing."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from ..checkpoint import architecture_of, read_config, with_token_ids
from . import dream, llada, llada2, sdar
from .args import ModelArgs
from .layers import Rotary
from .tp import TPShard, read_slice, shard_model

log = logging.getLogger(__name__)

ARCHITECTURES = {
    "LLaDAModelLM": (llada.args_from_config, llada.LLaDAModelLM),
    "DreamModel": (dream.args_from_config, dream.DreamModel),
    "SDARForCausalLM": (sdar.args_from_config, sdar.SDARForCausalLM),
    "LLaDA2MoeModelLM": (llada2.args_from_config, llada2.LLaDA2MoeModelLM),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def available_memory_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resolve_dtype(requested: str, cfg: dict, device: torch.device, weight_bytes: int = 0) -> torch.dtype:
    """`auto`: the checkpoint's dtype, but float32 for half precision on a CPU (faster there: docs/benchmarks.md §8),
    unless a bf16 checkpoint's fp32 copy would take over half the available memory."""
    if requested != "auto":
        return DTYPES[requested]
    dtype = DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"), torch.float32)
    if device.type != "cpu" or dtype not in (torch.float16, torch.bfloat16):
        return dtype
    if dtype == torch.bfloat16 and 2 * weight_bytes > available_memory_bytes() // 2:
        log.warning("dtype auto: keeping the checkpoint's bfloat16 on CPU (float32 weights would need %.1f GiB); "
                    "bf16 matmuls are slower than fp32 on most CPUs", 2 * weight_bytes / 2**30)
        return dtype
    return torch.float32


def _shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise ValueError(f"model: shard files listed in {index.name} are missing: {missing}")
        return [folder / f for f in files]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    raise ValueError(f"model: {folder} has neither model.safetensors nor model.safetensors.index.json")


def load_model(path: str | Path, dtype: str = "auto", device: str | torch.device = "cpu",
               fuse: bool = True, tp: TPShard | None = None) -> tuple[nn.Module, ModelArgs, torch.dtype]:
    """The model in eval mode; `fuse` joins projections (its state_dict then loses the checkpoint's names); with
    `tp`, only this rank's share of the sharded layers is read."""
    folder = Path(path)
    cfg = with_token_ids(read_config(folder), folder)
    make_args, cls = ARCHITECTURES[architecture_of(cfg, str(folder))]
    args = make_args(cfg)
    if tp is not None and tp.size > 1:
        args = dataclasses.replace(args, tp_size=tp.size)          # checks the degree against the heads
    device = torch.device(device)
    shards = _shard_files(folder)
    torch_dtype = resolve_dtype(dtype, cfg, device, sum(f.stat().st_size for f in shards))

    with torch.device("meta"):
        model = cls(args)
    slices = shard_model(model, tp) if args.tp_size > 1 else {}
    expected = set(model.state_dict().keys())
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name in expected:
                    t = read_slice(f, name, slices[name]) if name in slices else f.get_tensor(name)
                    state[name] = t.to(device=device, dtype=torch_dtype)
                else:
                    log.warning("ignoring unexpected tensor %s in %s", name, shard.name)
    missing = sorted(expected - state.keys())
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"model: checkpoint {folder} is missing tensors {missing[:5]}{more}")
    for name, tensor in state.items():
        want = model.get_parameter(name).shape
        if tensor.shape != want:
            raise ValueError(f"model: tensor {name} has shape {tuple(tensor.shape)}, config implies {tuple(want)}")
    model.load_state_dict(state, strict=True, assign=True)
    model.rotary = Rotary(args.rope_dim, args.rope_theta, args.max_len).to(device)
    if fuse:
        model.fuse_projections()
    elif args.tp_size > 1:
        raise ValueError("tensor parallel: the sharded model is a serving model (fuse=True)")
    model.eval().requires_grad_(False)
    return model, args, torch_dtype
