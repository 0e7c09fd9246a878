"""The benchmarks' shared harness: the argument parser, one timer, the table writer (markdown on
stdout, the same rows as JSON with --json), the server start and the engine workloads (loadgen's
arrivals, ids and send loop). Imported by the scripts: `from bench.harness import Report, parser`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Only the standard library at import time, the rest inside the functions that use it: bench.gpu_env
# must start where the serving stack is broken (to report it), and bench/ab.py runs this tree's
# scripts against an older tree's package, where a name one helper needs may be missing.


# ---- arguments ----
def parser(doc: str | None, *, model: str | None = None, threads: int | None = None, seed: int | None = None,
           json_out: bool = False) -> argparse.ArgumentParser:
    """An ArgumentParser whose --help shows the script's docstring, with the options benchmarks
    share: `model` (its help text) adds --model (default None: the script's default model),
    `threads` adds --threads (torch threads, that default), `seed` --seed (that default), and
    `json_out` --json (where Report.save writes the run's tables)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)     # run as `python -m bench.x`
    ap = argparse.ArgumentParser(prog=f"python -m {spec.name}" if spec else None, description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if model is not None:
        ap.add_argument("--model", default=None, help=model)
    if threads is not None:
        ap.add_argument("--threads", type=int, default=threads, help="torch threads")
    if seed is not None:
        ap.add_argument("--seed", type=int, default=seed)
    if json_out:
        ap.add_argument("--json", help="also write the tables (and figures) printed as JSON here")
    return ap


# ---- timing ----
class Timer:
    """Wall-clock seconds (perf_counter): `with Timer() as t: ...`, then `t.s`; inside the block
    `t.s` is the time so far."""

    def __enter__(self) -> Timer:
        self.t0, self.end = time.perf_counter(), None
        return self

    def __exit__(self, *exc) -> None:
        self.end = time.perf_counter()

    @property
    def s(self) -> float:
        return (time.perf_counter() if self.end is None else self.end) - self.t0


def samples_s(fn, reps: int, warmup: int = 0, inner: int = 1) -> list[float]:
    """Seconds per call of `fn()`: `reps` samples, each the mean over `inner` calls, after `warmup`
    untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        with Timer() as t:
            for _ in range(inner):
                fn()
        out.append(t.s / inner)
    return out


def median_time_s(fn, reps: int, warmup: int = 2) -> float:
    """The median wall time of `fn()` over `reps` calls, after `warmup` untimed ones."""
    return statistics.median(samples_s(fn, reps, warmup))


# ---- tables and JSON ----
def _plain(o):
    """JSON for what json cannot write itself: numpy scalars as numbers, the rest as strings."""
    return o.item() if hasattr(o, "item") else str(o)


def write_json(path: str | Path, data, indent: int | None = 1) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, default=_plain))
    return path


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())


class Table:
    """One markdown table, printed as it fills (header at once, then each row as `row` gets it,
    flushed, so a long run shows what it has measured) and kept for the JSON. A column is a name
    or (name, format spec): the spec formats that column's numbers (".3f"); a string cell prints
    as given; `cell` formats the floats of columns without a spec (default: str)."""

    def __init__(self, columns, title: str | None = None, cell=None):
        self.names = [c if isinstance(c, str) else c[0] for c in columns]
        self.specs = [None if isinstance(c, str) else c[1] for c in columns]
        self.title, self.cell, self.rows = title, cell, []
        if title is not None:
            print(title)
        print("| " + " | ".join(self.names) + " |")
        print("|" + "---|" * len(self.names), flush=True)

    def _text(self, value, spec) -> str:
        if isinstance(value, str):
            return value
        if spec is not None and value is not None:
            return format(value, spec)
        if self.cell is not None and isinstance(value, float):
            return self.cell(value)
        return str(value)

    def row(self, *cells) -> None:
        self.rows.append(list(cells))
        print("| " + " | ".join(self._text(v, s) for v, s in zip(cells, self.specs)) + " |", flush=True)

    def as_json(self) -> dict:
        keys, seen = [], {}
        for n in self.names:                   # a repeated column name ("speed-up", "error") gets " 2", " 3"
            seen[n] = seen.get(n, 0) + 1
            keys.append(n if seen[n] == 1 else f"{n} {seen[n]}")
        return {"title": self.title, "rows": [dict(zip(keys, r)) for r in self.rows]}


class Report:
    """The tables of one run and any figures beside them: `table()` starts one, `add()` notes a
    figure, `save()` writes all of it as JSON to `path` (the --json option; nothing without one)."""

    def __init__(self, path: str | Path | None = None, **figures):
        self.path, self.tables, self.figures = path, [], dict(figures)

    def table(self, columns, title: str | None = None, cell=None) -> Table:
        t = Table(columns, title, cell)
        self.tables.append(t)
        return t

    def add(self, **figures) -> None:
        self.figures.update(figures)

    def save(self) -> Path | None:
        if not self.path:
            return None
        return write_json(self.path, {**self.figures, "tables": [t.as_json() for t in self.tables]})


def result(figures: dict) -> None:
    """The line bench/ab.py tabulates side by side: `RESULT {json}`, the run's headline numbers."""
    print("RESULT " + json.dumps(figures, default=_plain))


# ---- the server ----
def start_server(model, *flags: str, log_path: str | Path | None = None, timeout_s: float = 120, env=None):
    """`dllm-server serve [model] *flags` on a free loopback port, healthy (the package's own
    dllm_server.server_process.serve); its log goes to `log_path`, by default a file in a new
    temporary folder that stays after the run, for a failure's post-mortem."""
    from dllm_server.server_process import serve
    log_path = log_path or Path(tempfile.mkdtemp(prefix="bench-server-")) / "server.log"
    return serve(model, *flags, log_path=log_path, timeout_s=timeout_s, env=env)


@contextlib.contextmanager
def server(model, *flags: str, log_path: str | Path | None = None, timeout_s: float = 120, stop_s: float = 60,
           env=None):
    """start_server as a context: the server (its .url, .pid) inside, stopped on leaving."""
    s = start_server(model, *flags, log_path=log_path, timeout_s=timeout_s, env=env)
    try:
        yield s
    finally:
        s.stop(timeout=stop_s)


# ---- workloads ----
MIXES = {   # name -> (prompt lengths, answer lengths, [low, high) of the prompt ids before the offset)
    "scheduler": ((32, 96, 224), (32, 64, 96), (1, 250)),          # bench/scheduler.py, bench/sim_validate.py
    "handoff": ((96, 224, 480), (64, 96), (1, 250)),               # bench/handoff.py
    "decode-heavy": ((24, 48, 64), (96, 128, 160), (32, 127)),     # bench/paper.py: printable bytes,
    "prefill-heavy": ((384, 512, 640), (32, 32, 64), (32, 127)),   # scaled to a 1024-token context
}


def plain_ids(model) -> int:
    """The shift that keeps synthetic prompt ids clear of a checkpoint's special tokens
    (checkpoint.plain_id_offset_of: past a BPE's specials, 0 for a byte-level model)."""
    from dllm_server.checkpoint import plain_id_offset_of
    return plain_id_offset_of(model)


def poisson_workload(n: int, rate: float, seed: int, prompt_lens, answer_lens, token_range=(1, 250),
                     offset: int = 0) -> list:
    """[(arrival_s, prompt, params)] for the in-process engine: loadgen's Poisson arrivals and
    random ids, lengths drawn from the given choices, `ignore_eos`, seed i; ids from
    `token_range` shifted by `offset` (plain_ids: past a BPE's specials)."""
    import numpy as np

    from dllm_server import SamplingParams
    from loadgen.arrivals import arrival_offsets
    from loadgen.workload import random_ids
    rng = np.random.default_rng(seed)
    offsets = arrival_offsets("poisson", rate, n, rng)
    reqs = []
    for i, at in enumerate(offsets):
        prompt = random_ids(int(rng.choice(prompt_lens)), rng, token_range[1] + offset, token_range[0] + offset)
        reqs.append((float(at), {"prompt_token_ids": prompt},
                     SamplingParams(max_tokens=int(rng.choice(answer_lens)), ignore_eos=True, seed=i)))
    return reqs


def engine_workload(mix: str, n: int, rate: float, seed: int, model=None) -> list:
    """poisson_workload of one of MIXES, its ids clear of `model`'s special tokens."""
    prompts, answers, ids = MIXES[mix]
    return poisson_workload(n, rate, seed, prompts, answers, token_range=ids, offset=plain_ids(model))


def id_prompts(n: int, prompt_lens, seed: int = 0, offset: int = 0, token_range=(1, 250)) -> list[list[int]]:
    """`n` prompts of token ids (loadgen's random ids), each of a length drawn from `prompt_lens`,
    ids from `token_range` shifted by `offset`."""
    import numpy as np

    from loadgen.workload import random_ids
    rng = np.random.default_rng(seed)
    lo, hi = token_range[0] + offset, token_range[1] + offset
    return [random_ids(int(rng.choice(prompt_lens)), rng, hi, lo) for _ in range(n)]


async def replay(engine, reqs) -> tuple[list[float], list, float]:
    """Submit each request of a workload to an AsyncEngine at its arrival time (loadgen's open
    loop). Returns (latencies in completion order, outputs in request order, wall seconds)."""
    from loadgen.run import open_loop
    latencies = []

    async def one(i: int):
        _, prompt, params = reqs[i]
        t0 = time.monotonic()
        out = await engine.run(prompt, params)
        latencies.append(time.monotonic() - t0)
        return out

    with Timer() as t:
        outs = await open_loop([r[0] for r in reqs], one, time.perf_counter())
    return latencies, outs, t.s


def step_items(llm, batch: int, prompt: int, block: int, canvas_len: int, tag: str) -> list:
    """B canvases whose first block after the prompt is open, their KV filled by a full forward:
    the forward items of one loaded decode iteration (dual cache) of an offline LLM."""
    import torch

    from dllm_server.worker.runner import ForwardItem, fed_range
    a, pool = llm.args, llm.core.pool
    first = 1 + plain_ids(llm.config.model)
    items = []
    for b in range(batch):
        canvas = torch.full((canvas_len,), a.mask_id, dtype=torch.int64)
        canvas[:prompt] = torch.arange(prompt) % 200 + first + b
        alloc = pool.allocate(f"{tag}{b}", canvas_len)
        llm.runner.forward([ForwardItem(canvas, alloc, 0, canvas_len, prompt, prompt + block)])
        lo, hi = fed_range("dual", False, prompt, prompt + block, canvas_len, llm.core.stepper.lead)
        items.append(ForwardItem(canvas, alloc, lo, hi, prompt, prompt + block))
    return items
