"""Processes of a tensor-parallel forward for tests/model/test_tp_forward.py: rank 0 leads (its
runner sends each forward's plan), the others follow (worker/tp.py), over gloo on loopback."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dllm_server.model.loader import load_model
from dllm_server.server_process import free_port
from dllm_server.model.tp import TPShard
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner
from dllm_server.worker.tp import PlanSender, follow, init_groups

PAGE, PAGES = 4, 128


def packed_forwards(runner: ModelRunner, pool: KVPool, args) -> list[torch.Tensor]:
    """Full forwards of 5 canvases (3 of them on fragmented pages), then ONE packed forward of 2
    fresh prefills and 3 dual-cache decode steps on the first canvases' KV. Returns the model's own
    outputs, in the model's dtype (the runner hands the sampler float32 logits: a float64 forward
    is compared before that cast)."""
    raw: list[torch.Tensor] = []
    hook = runner.model.register_forward_hook(lambda module, inputs, out: raw.append(out.detach().clone()))
    try:
        _packed_forwards(runner, pool, args)
    finally:
        hook.remove()
    return raw


def _packed_forwards(runner: ModelRunner, pool: KVPool, args) -> None:
    g = torch.Generator().manual_seed(7)
    lens = [40, 24, 33, 56, 29]
    canvases, allocs = [], []
    for i, n in enumerate(lens):
        if i == 2:           # fragment the pool: the later canvases get gathered pages
            for k in range(pool.num_free_pages):
                pool.allocate(f"one-{k}", PAGE)
            for k in range(0, len(pool.owners()), 2):
                pool.free(f"one-{k}")
        c = torch.randint(0, args.vocab_size - 8, (n,), generator=g)
        c[n - 8:] = args.mask_id
        canvases.append(c)
        allocs.append(pool.allocate(f"r{i}", n))
    assert allocs[0].slot_ids is None and all(a.slot_ids is not None for a in allocs[2:])
    runner.forward([ForwardItem(c, a, 0, c.numel(), c.numel() - 8, c.numel()) for c, a in
                    zip(canvases[:3], allocs[:3])])
    items = [ForwardItem(canvases[3], allocs[3], 0, lens[3], lens[3] - 8, lens[3]),
             ForwardItem(canvases[4], allocs[4], 0, lens[4], lens[4] - 8, lens[4])]
    for c, a in zip(canvases[:3], allocs[:3]):
        n = c.numel()
        items.append(ForwardItem(c, a, n - 8, n, n - 8, n))                  # a block step against cached KV
    runner.forward(items)


def build(path: str, dtype: str, shard: TPShard | None):
    model, args, torch_dtype = load_model(path, dtype, tp=shard)
    pool = KVPool(args.num_layers, PAGES, PAGE, args.local_kv_heads, args.head_dim, torch_dtype)
    return ModelRunner(model, args, pool, torch.device("cpu")), pool, args


def rank_main(rank: int, size: int, port: int, path: str, dtypes: list[str], results) -> None:
    torch.set_num_threads(1)
    groups = init_groups(rank, size, "127.0.0.1", port, torch.device("cpu"))
    try:
        for dtype in dtypes:
            runner, pool, args = build(path, dtype, TPShard(rank, size, groups.all_reduce))
            if rank == 0:
                sender = runner.plan_sink = PlanSender(groups)
                results.put((dtype, [o.numpy().copy() for o in packed_forwards(runner, pool, args)]))
                sender.stop()
            else:
                results.put((f"follower-{rank}-{dtype}", follow(runner, groups, args.mask_id, PAGE)))
    finally:
        dist.destroy_process_group()


def run_ranks(path: str, dtypes: list[str], size: int = 2) -> dict:
    """Starts `size` spawned ranks over gloo on `path`; returns what they put: the leader's outputs by
    dtype and each follower's forward count under `follower-{rank}-{dtype}`."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, size, port, path, dtypes, results)) for r in range(size)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in range(size * len(dtypes)))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return got
