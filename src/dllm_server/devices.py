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


def check_gpu_count(placement: str, num_workers: int, num_gpus: int) -> None:
    """Workers that hand KV over need a GPU each: NCCL refuses two ranks on one device."""
    if placement != "colocated" and num_workers > num_gpus:
        raise ValueError(f"placement: {placement} on CUDA needs one GPU per worker for the NCCL KV "
                         f"handoff ({num_workers} workers, {num_gpus} GPUs); use fewer workers, more GPUs, "
                         f"colocated placement or --device cpu")


def worker_devices(device: str, placement: str, num_workers: int, tp: int = 1) -> list[tuple[str, ...]]:
    """The device of every rank of every worker: CUDA devices round-robin, or the CPU for all."""
    import torch
    kind = resolve_device(device)
    if kind == "cpu":
        return [("cpu",) * tp] * num_workers
    count = torch.cuda.device_count()
    check_gpu_count(placement, num_workers, count)
    check_tp_gpus(tp, count)
    return [tuple(f"cuda:{(i * tp + r) % count}" for r in range(tp)) for i in range(num_workers)]


def check_tp_gpus(tp: int, num_gpus: int) -> None:
    if tp > num_gpus:
        raise ValueError(f"tensor_parallel_size: {tp} needs {tp} GPUs per instance (one per rank), {num_gpus} "
                         "visible; use a smaller degree or --device cpu")
