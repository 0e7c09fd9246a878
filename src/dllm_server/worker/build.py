"""Builds a WorkerCore from a checkpoint folder, the same way for worker processes and the offline LLM."""
from __future__ import annotations

import logging
from typing import Callable

import torch

from ..config import WorkerConfig
from ..messages import ModelInfo
from ..model.args import ModelArgs
from ..model.loader import load_model
from ..model.moe import flashinfer_kernel, use_fused_experts
from ..model.tp import TPShard
from .core import WorkerCore
from .determinism import set_fixed_rows
from .handoff import WorkerHandoffs
from .kv_pool import KVPool
from .kv_shards import KVWorld
from .kv_transfer import TorchTransport, Waiter
from .model_step import ModelStepper
from .prefix_cache import PrefixCache
from .profile import profile_iterations
from .memory import glibc_malloc_trim
from .tp import PlanSender, TPGroups, rss_mb

log = logging.getLogger(__name__)


def model_info(args: ModelArgs) -> ModelInfo:
    return ModelInfo(args.arch, args.vocab_size, args.embedding_size, args.mask_id, args.eos_id, args.max_len,
                     args.hidden, args.num_layers, args.num_heads, args.num_kv_heads, args.head_dim, args.mlp_hidden,
                     args.block_size)


def build_stepper(config: WorkerConfig, model_path: str, device: torch.device,
                  tp: TPGroups | None = None) -> tuple[ModelStepper, KVPool, ModelArgs]:
    """This rank's model shard, its KV pool and the stepper that runs them: what every rank of an instance has."""
    shard = TPShard(tp.rank, tp.size, tp.all_reduce) if tp is not None else None
    trim = glibc_malloc_trim() or (lambda: None)      # what the allocator keeps for reuse is not the weights
    trim()
    before = rss_mb(anonymous=True)
    model, args, dtype = load_model(model_path, config.dtype, device, tp=shard)
    trim()
    weights_mb = rss_mb(anonymous=True) - before      # this rank's weights as the process holds them (not the file)
    set_fixed_rows(model, config.fixed_matmul_rows)
    if args.moe is not None and config.moe_backend == "flashinfer":
        fuse_moe_kernel(model, device, config.fixed_matmul_rows)
    pool = KVPool(args.num_layers, config.num_pages, config.page_size, args.local_kv_heads, args.head_dim, dtype,
                  device)
    stepper = ModelStepper(config, model, args, pool, device)
    stepper.weights_rss_mb = weights_mb
    stepper.grammar_folder = str(model_path)
    return stepper, pool, args


def fuse_moe_kernel(model, device: torch.device, fixed_rows: int) -> int:
    """--moe-backend flashinfer: the fused kernel where it is installed and computes what the torch experts do; not
    under forced batch invariance (its tiling may follow the token count). Returns the layers fused."""
    kernel = flashinfer_kernel() if device.type == "cuda" and not fixed_rows else None
    fused = use_fused_experts(model, kernel) if kernel is not None else 0
    log.info("moe backend: %s", f"FlashInfer fused kernel in {fused} layers" if fused else
             "torch (FlashInfer's fused MoE needs CUDA, the package and no fixed-row matmuls)")
    return fused


def build_core(config: WorkerConfig, model_path: str, device: torch.device, worker_id: int = 0,
               kv_ranks: tuple[tuple[int, ...], ...] | None = None, emit: Callable[[list], None] | None = None,
               tp: TPGroups | None = None) -> tuple[WorkerCore, ModelInfo]:
    """`kv_ranks`: it sends or receives KV in this torch.distributed world (every worker's ranks, kv_shards.KVWorld);
    `tp`: it leads a TP instance."""
    stepper, pool, args = build_stepper(config, model_path, device, tp)
    sender = PlanSender(tp) if tp is not None else None
    stepper.runner.plan_sink = sender
    handoffs = None
    if kv_ranks is not None:
        world = KVWorld(kv_ranks, args.num_kv_heads)
        transport = TorchTransport(worker_id, pool.layers, Waiter(device),
                                   route=lambda peer: world.pieces(worker_id, 0, peer),
                                   tell=sender.tell if sender is not None else None, kv_heads=args.num_kv_heads)
        handoffs = WorkerHandoffs(worker_id, pool, transport)
    cache = PrefixCache(pool, args.block_size) if config.prefix_caching and args.block_size else None
    return WorkerCore(config, stepper, pool, args.mask_id, handoffs, emit, cache), model_info(args)


def startup_profile(core: WorkerCore, info: ModelInfo) -> tuple[tuple[float, ...], ...]:
    """Iteration timings for the front's step-time model (only policies that predict need it)."""
    if not core.config.profile:
        return ()
    return profile_iterations(core, info.max_len, info.vocab_size)
