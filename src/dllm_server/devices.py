"""Device resolution for the engine and the offline LLM: `auto` means CUDA when available."""
from __future__ import annotations


def resolve_device(name: str) -> str:
    import torch
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was requested but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"device: must be cpu, cuda or auto, got {name!r}")
    return name


def check_gpu_count(placement: str, num_ranks: int, num_gpus: int) -> None:
    """Ranks that hand KV over need a GPU each: NCCL refuses two ranks on one device."""
    if placement != "colocated" and num_ranks > num_gpus:
        raise ValueError(f"placement: {placement} on CUDA needs one GPU per worker rank for the NCCL KV "
                         f"handoff ({num_ranks} ranks, {num_gpus} GPUs); use fewer workers, more GPUs, "
                         f"colocated placement or --device cpu")


def worker_devices(device: str, placement: str, degrees: list[int]) -> list[tuple[str, ...]]:
    """The device of every rank of every worker (`degrees`: each one's TP degree): CUDA devices round-robin, or the
    CPU for all."""
    import torch
    kind = resolve_device(device)
    if kind == "cpu":
        return [("cpu",) * d for d in degrees]
    count = torch.cuda.device_count()
    check_gpu_count(placement, sum(degrees), count)
    check_tp_gpus(max(degrees), count)
    starts = [sum(degrees[:i]) for i in range(len(degrees))]
    return [tuple(f"cuda:{(s + r) % count}" for r in range(d)) for s, d in zip(starts, degrees)]


def check_tp_gpus(tp: int, num_gpus: int) -> None:
    if tp > num_gpus:
        raise ValueError(f"tensor_parallel_size: {tp} needs {tp} GPUs per instance (one per rank), {num_gpus} "
                         "visible; use a smaller degree or --device cpu")
