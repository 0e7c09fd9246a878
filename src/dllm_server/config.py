"""ServerConfig: the single source of every default (CLI, docs/configuration.md, tests and benchmarks derive from
it), in sections; each field carries its help and the rules it is checked against. Only plain values: runtime facts
never come back into the config. Imports nothing from the package."""
from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import ClassVar

CACHE_MODES = ("none", "prefix", "dual")
DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
DREAM_DECODING = ("fast_dllm", "shifted")
_BOUNDS = ("ge", "gt", "le", "lt")
_CHECKS = (("ge", operator.ge), ("gt", operator.gt), ("le", operator.le), ("lt", operator.lt))


def _f(default, help: str, **rules):
    """A config field: its help text and rules (choices, ge / gt / le / lt, nonempty) in its metadata."""
    return field(default=default, metadata={"help": help, **rules})


def _range(meta) -> str:
    lo = f"[{meta['ge']}" if "ge" in meta else f"({meta['gt']}" if "gt" in meta else None
    hi = f"{meta['le']}]" if "le" in meta else f"{meta['lt']})" if "lt" in meta else None
    if lo and hi:
        return f"in {lo}, {hi}"
    return " ".join(next((s, str(meta[k])) for k, s in zip(_BOUNDS, (">=", ">", "<=", "<")) if k in meta))


def check_fields(obj) -> None:
    """Every field of a config dataclass against the rules in its metadata (ValueError naming it)."""
    for f in dataclasses.fields(obj):
        value, meta = getattr(obj, f.name), f.metadata
        if value is None:
            continue                     # None is the documented default or "unlimited" where the type allows it
        if "choices" in meta and value not in meta["choices"]:
            raise ValueError(f"{f.name}: must be one of {', '.join(map(str, meta['choices']))}, got {value!r}")
        if meta.get("nonempty") and value == "":
            raise ValueError(f"{f.name}: must not be empty (leave it unset for the default)")
        if any(b in meta for b in _BOUNDS):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{f.name}: must be a number, got {value!r}")
            if not all(op(value, meta[b]) for b, op in _CHECKS if b in meta):
                raise ValueError(f"{f.name}: must be {_range(meta)}, got {value}")


@dataclass(frozen=True)
class _Section:
    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class ModelConfig(_Section):
    """Which checkpoint and how it runs on the device."""
    SECTION: ClassVar[str] = "model"

    model: str | None = _f(None, "HF checkpoint folder or Hugging Face model id (ORG/NAME, fetched through "
                           "huggingface_hub: HF_HOME, HF_TOKEN, HF_HUB_OFFLINE apply); none = the embedded demo model",
                           nonempty=True)
    revision: str | None = _f(None, "model id only: the branch, tag or commit to fetch (default: main)", nonempty=True)
    download_dir: str | None = _f(None, "model id only: the Hugging Face cache folder to use (default: HF_HUB_CACHE, "
                                  "under HF_HOME)", nonempty=True)
    generation_config: str | None = _f("auto", "request defaults (temperature, top_p, top_k, min_p, max_new_tokens) "
                                       "and EOS ids from generation_config.json: auto = the model folder's, a folder "
                                       "path = that folder's, none = ignore it (server defaults only)", nonempty=True)
    served_model_name: str | None = _f(None, "name reported by /v1/models (default: the model id, else the folder "
                                       "name)", nonempty=True)
    dtype: str = _f("auto", "weights and KV dtype: auto (checkpoint's; on CPU fp32 for fp16/bf16 ones), "
                    "float32, bfloat16, float16, float64", choices=DTYPES)
    device: str = _f("auto", "cpu, cuda or auto (cuda when available)", choices=("auto", "cpu", "cuda"))
    attention_backend: str = _f("sdpa", "sdpa (CPU/GPU) or flashinfer (CUDA; falls back to SDPA without CUDA or "
                                "the package; not yet validated on a GPU)",
                                choices=("sdpa", "flashinfer"))
    moe_backend: str = _f("torch", "MoE layers: torch (grouped matmuls) or flashinfer (CUDA: its fused kernel where "
                          "it agrees with torch at load; docs/llada2.md)", choices=("torch", "flashinfer"))
    enforce_eager: bool = _f(False, "CUDA: run decode-only iterations eagerly instead of replaying CUDA graphs "
                             "captured per (batch, block, key length) bucket")
    skip_tokenizer_init: bool = _f(False, "allow a checkpoint without tokenizer files (prompts as token ids)")


@dataclass(frozen=True)
class DecodeConfig(_Section):
    """Server-wide decoding defaults (requests may override the sampling ones) and the threshold policy."""
    SECTION: ClassVar[str] = "decode policy"

    block_length: int = _f(32, "tokens per diffusion block (Fast-dLLM default 32)", ge=1)
    cache: str = _f("dual", "KV reuse inside a block: none (exact), prefix or dual", choices=CACHE_MODES)
    threshold: float = _f(0.9, "default confidence threshold for parallel commits", ge=0.0, le=1.0)
    dream_decoding: str = _f("fast_dllm", "Dream under the prefix / dual cache: fast_dllm (Fast-dLLM's block sampler: "
                             "a block's full forward commits only its first position, cached steps feed from the "
                             "block start) or shifted (dInfer's window from one position earlier; docs/decoding.md)",
                             choices=DREAM_DECODING)
    fixed_matmul_rows: int = _f(0, "run every projection as matmuls of exactly this many rows (the last zero-padded), "
                                "so a row's result never depends on its batch, on kernels where it otherwise does "
                                "(docs/decoding.md). 0: one matmul per projection", ge=0)
    block_causal_finalise: str = _f("fused", "block-causal families (SDAR): fused writes a finished block's KV in "
                                    "the next block's first forward (exact, a forward a block saved); separate "
                                    "runs a forward of its own for it first (the unfused reference); recompute "
                                    "feeds the whole prefix again at every block (the no-cache reference)",
                                    choices=("fused", "separate", "recompute"))
    enable_prefix_caching: bool = _f(True, "block-causal families (SDAR): share committed prompt KV across "
                                     "requests with the same prefix (exact; LLaDA / Dream never: their prompt KV "
                                     "depends on the answer). Off under block_causal_finalise recompute (it rewrites the prefix)")
    threshold_policy: str = _f("fixed", "fixed: every block commits at the request's threshold (else --threshold); "
                               "slo: per block, the highest candidate threshold whose predicted remaining latency "
                               "fits the request's SLO (slo_ms)", choices=("fixed", "slo"))
    slo_thresholds: str = _f("0.95,0.9,0.8,0.7,0.6,0.5", "candidate thresholds of the slo policy, comma-separated")
    default_slo_ms: float | None = _f(None, "SLO of a request that gives no slo_ms; none: such a request decodes at "
                                      "the highest threshold load control allows", gt=0.0)
    quality_floor: float = _f(0.5, "the lowest threshold the slo policy and load control may choose", ge=0.0, le=1.0)
    slo_raise_slack: float = _f(0.3, "slo policy: a threshold above --threshold only when its predicted latency "
                                "leaves this share of the request's remaining SLO budget unused, for a request alone on "
                                "its worker, never while load control caps thresholds (docs/slo.md)", ge=0.0, lt=1.0)
    load_control: bool = _f(True, "slo policy: cap every request's threshold when the worst-case load would "
                            "exceed the cluster's capacity")
    load_target: float = _f(0.7, "load control keeps the needed forward rate within this share of what the workers can "
                            "run within the SLO (headroom for bursts of Poisson-like arrivals)", ge=0.1, le=1.0)
    step_predictor: str | None = _f(None, "step predictor artefact (JSON); none: step_predictor.json in the model "
                                    "folder when present, else the simple estimator")
    seed: int = _f(0, "seed for requests that give none")


@dataclass(frozen=True)
class SchedulingConfig(_Section):
    """Each worker's deficit token budget and KV pages, and how the front routes blocks."""
    SECTION: ClassVar[str] = "scheduling"

    token_budget: int | None = _f(1024, "tau: tokens per iteration for the deficit scheduler; "
                                  "none = unlimited (prefill priority)", ge=1)
    max_active_decodes: int = _f(64, "cap on seated in-block decodes per worker iteration", ge=1)
    credit_share: float = _f(0.125, "share of tau a waiting prefill earns per iteration even when decodes alone "
                             "exceed tau (the starvation bound of the deficit scheduler)", gt=0.0, le=1.0)
    page_size: int = _f(16, "tokens per KV page", ge=1)
    num_pages: int | None = _f(None, "KV pages per worker; none = sized from kv_cache_tokens", ge=1)
    kv_cache_tokens: int = _f(65536, "KV capacity per worker in tokens when num_pages is not set (CPU)", ge=1)
    routing: str = _f("load", "colocated: a block to the fewest outstanding prefill tokens (load), the earliest "
                      "predicted completion (completion), or that of the slowest instances fitting its SLO (slo-class)",
                      choices=("load", "completion", "slo-class"))
    scheduling_policy: str = _f("deadline", "the order a worker admits waiting prefills and re-prefills in: fcfs "
                                "(arrival) or deadline (earliest SLO deadline first; a request that can no longer meet "
                                "its SLO yields; docs/slo.md)", choices=("fcfs", "deadline"))
    default_deadline_s: float = _f(30.0, "deadline scheduling: a request without an SLO is due this long after it "
                                   "arrives (its place in line only), and a late one yields by as much", gt=0.0)
    overflow_threshold_tokens: int = _f(8192, "theta: outstanding prefill tokens past which hybrid overflows", ge=0)
    kv_transfer: str = _f("layerwise", "disaggregated KV handoff: layerwise (the receiver picked at dispatch, each "
                          "layer sent as the prefill forward finishes it) or after_prefill (picked and sent once the "
                          "prefill step is done)", choices=("layerwise", "after_prefill"))


@dataclass(frozen=True)
class ClusterConfig(_Section):
    """Worker processes: placement, instances, tensor parallelism, Ray, regrouping, health and memory."""
    SECTION: ClassVar[str] = "cluster"

    placement: str = _f("colocated", "colocated, disaggregated or hybrid",
                        choices=("colocated", "disaggregated", "hybrid"))
    num_workers: int = _f(1, "worker processes (colocated: all; otherwise decode workers)", ge=1)
    num_prefill_workers: int = _f(1, "prefill workers in disaggregated / hybrid placement", ge=1)
    tensor_parallel_size: int = _f(1, "tensor-parallel degree of every instance (a worker as the scheduler sees it; "
                                   "disaggregated / hybrid: of the decode ones): this many processes, one GPU each on "
                                   "CUDA, sharding heads and MLP rows; divides the attention and KV heads", ge=1)
    prefill_tensor_parallel_size: int = _f(0, "disaggregated / hybrid: the prefill instances' degree (0: "
                                           "tensor_parallel_size); KV moves rank to rank (docs/parallelism.md)", ge=0)
    distributed_executor_backend: str = _f("mp", "how worker processes start: mp (local subprocesses) or ray "
                                           "(Ray actors on a Ray cluster, maybe on other nodes; docs/multinode.md)",
                                           choices=("mp", "ray"))
    ray_address: str | None = _f(None, "ray only: the cluster to join (auto: the running one on this machine, or "
                                 "HOST:PORT); none: start a local Ray instance")
    ray_placement_strategy: str = _f("PACK", "ray only: placement of the workers' bundles (PACK: as few nodes as "
                                     "possible; SPREAD / STRICT_SPREAD: over nodes, e.g. prefill and decode apart)",
                                     choices=("PACK", "SPREAD", "STRICT_SPREAD", "STRICT_PACK"))
    ray_namespace: str = _f("dllm-server", "ray only: the Ray namespace of this server's actors")
    reconfigure: bool = _f(False, "regroup the devices into instances of other TP degrees while serving, planned "
                           "every reconfigure_period_s (colocated, mp backend, slo policy; docs/reconfiguration.md)")
    reconfigure_planner: str = _f("attainment", "attainment: the layout its model predicts meets the most SLOs; ilp: "
                                  "DiLaServe's capacity MILP at one SLO", choices=("attainment", "ilp"))
    reconfigure_period_s: float = _f(60.0, "how often the reconfiguration planner decides (bursts shorter than "
                                     "this are load control's)", gt=0.0)
    reconfigure_min_gain: float = _f(0.02, "the least gain a regroup must bring (hysteresis): in SLO attainment "
                                     "after the restart's price (attainment), in mean threshold (ilp)", ge=0.0, lt=1.0)
    reconfigure_memory_periods: int = _f(8, "periods the planner remembers: a move must carry the busiest; until "
                                         "then the load the starting layout meets its SLOs at is one", ge=1)
    reconfigure_restart_s: float = _f(30.0, "seconds a regroup keeps a wave's devices out, until one is measured "
                                      "(the attainment planner's restart price)", gt=0.0)
    reconfigure_wave_share: float = _f(0.5, "the largest share of the devices a regroup takes out at once, a wave "
                                       "(a whole instance may exceed it; 1: all at once)", gt=0.0, le=1.0)
    reconfigure_prior_serial_share: float = _f(0.4, "the prior for a degree never run: the share s of a step TP "
                                               "does not shorten, speed-up 1 / (s + (1 - s) / d)", ge=0.0, lt=1.0)
    threads_per_worker: int | None = _f(None, "torch threads per CPU worker; none = (usable cores - 1) / workers", ge=1)
    restart_workers: bool = _f(True, "restart a dead worker (else the engine shuts down non-zero)")
    worker_stall_timeout_s: float = _f(120.0, "watchdog: a worker with work in flight that reports nothing for this "
                                       "many seconds is killed and treated as dead; 0 turns the watchdog off", ge=0.0)
    cpu_kernel_cache_entries: int = _f(64, "CPU workers: bound oneDNN's two per-shape kernel caches (its primitive "
                                       "cache and ideep's, 1024 entries each by default) to this many entries "
                                       "each (docs/reliability.md); 0: the libraries' defaults", ge=0)
    worker_malloc_trim_s: float = _f(10.0, "a worker that goes idle returns freed heap memory to the OS "
                                     "(glibc malloc_trim) at most this often; 0: never", ge=0.0)
    cpu_malloc_hold_mb: int = _f(128, "CPU workers: glibc keeps up to this many MB of freed activations for reuse "
                                 "instead of page-faulting fresh memory every forward (the idle trim still returns "
                                 "it). 0: glibc's defaults", ge=0, le=2047)


@dataclass(frozen=True)
class HTTPConfig(_Section):
    """The OpenAI-compatible server: binding, auth, defaults, and the limits that protect it (docs/reliability.md)."""
    SECTION: ClassVar[str] = "HTTP"

    host: str = _f("127.0.0.1", "bind address")
    port: int = _f(8000, "bind port", ge=1, le=65535)
    api_key: str | None = _f(None, "require this bearer key (env DLLM_API_KEY)")
    max_waiting_requests: int = _f(1024, "bounded waiting queue; beyond it requests get 503", ge=1)
    default_chat_max_tokens: int = _f(128, "max_tokens of a chat request that gives none", ge=1)
    default_completion_max_tokens: int = _f(16, "max_tokens of a completion request giving none (OpenAI's)", ge=1)
    allowed_origins: str = _f("*", "CORS allowed origins, comma-separated")
    keep_alive_s: float = _f(10.0, "SSE keep-alive comment after this many seconds of silence", gt=0.0)
    shutdown_timeout_s: float = _f(30.0, "SIGTERM drain time; 0 aborts in-flight requests", ge=0.0)
    admin_endpoints: bool = _f(False, "serve the operator endpoints: GET / POST /reconfigure shows / regroups the "
                               "instances by hand (docs/reconfiguration.md); --api-key guards them too")
    playground: bool = _f(True, "serve the web playground (the canvas as it denoises) at /playground; / goes there")
    max_request_body_bytes: int = _f(4 << 20, "largest request body; a bigger one is refused with 413 while it is "
                                     "read, before any parsing", ge=1)
    body_read_timeout_s: float = _f(30.0, "a request body not received in full within this many seconds: 408", gt=0.0)
    max_messages: int = _f(512, "most messages in one chat request", ge=1)
    max_stop_strings: int = _f(16, "most stop strings in one request", ge=1)
    max_stop_chars: int = _f(256, "longest stop string, in characters", ge=1)
    max_prompts_per_request: int = _f(256, "most prompts in one completions request", ge=1)
    stream_buffer_events: int = _f(512, "events buffered for one stream whose client lags; beyond it the request "
                                   "ends with an error (text streams coalesce and never reach it)", ge=1)
    socket_send_buffer_bytes: int = _f(256 << 10, "kernel send buffer of each client connection (SO_SNDBUF; 0: "
                                       "autotuned, up to megabytes): what a client that stops reading can leave "
                                       "queued in the kernel before its stream stalls", ge=0)
    stream_stall_timeout_s: float = _f(30.0, "a streaming client that accepts no data for this many seconds is "
                                       "disconnected and its request aborted (KV freed)", gt=0.0)
    structured_compile_timeout_s: float = _f(30.0, "structured output whose automaton compiles longer: 400", gt=0.0)


@dataclass(frozen=True)
class DebugConfig(_Section):
    """Diagnostics."""
    SECTION: ClassVar[str] = "debug"

    trace_dir: str | None = _f(None, "write per-step decoding traces (JSONL) to this folder (to train the step "
                               "predictor)")


@dataclass(frozen=True)
class ServerConfig(DebugConfig, HTTPConfig, ClusterConfig, SchedulingConfig, DecodeConfig, ModelConfig):
    """Every section's fields, flat: `ServerConfig(block_length=8)`, `config.block_length`, one flag each. The
    rules that tie sections together are checked here."""

    def __post_init__(self) -> None:
        super().__post_init__()

        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name}: {why}")

        if self.revision is not None and self.model is None:
            bad("revision", "needs a model id (the embedded demo model has no revisions)")
        cands = self.candidate_thresholds          # parses and checks slo_thresholds
        if not any(c >= self.quality_floor for c in cands):
            bad("quality_floor", f"{self.quality_floor} is above every candidate threshold {cands}")
        self.worker_policy()          # token_budget, max_active_decodes, credit_share
        if self.kv_cache_tokens < self.page_size:
            bad("kv_cache_tokens", f"must be >= page_size, got {self.kv_cache_tokens}")
        if self.reconfigure and (self.placement != "colocated" or self.distributed_executor_backend != "mp"
                                 or self.threshold_policy != "slo"):
            bad("reconfigure", "needs colocated placement, the mp backend and --threshold-policy slo (the planner "
                "plans thresholds; disaggregated workers hand KV between fixed pairs; ray fixes its bundles)")
        if self.prefill_tensor_parallel_size and self.placement == "colocated":
            bad("prefill_tensor_parallel_size", "needs disaggregated or hybrid placement (no prefill instances)")

    def degree(self, role: str) -> int:             # an instance's TP degree in this role
        return (role == "prefill" and self.prefill_tensor_parallel_size) or self.tensor_parallel_size

    def check_model_heads(self, num_heads: int, num_kv_heads: int) -> None:
        """The rules that need the model's head counts (read from its config.json before any weights load)."""
        for name in ("tensor_parallel_size", "prefill_tensor_parallel_size"):
            if getattr(self, name) and (why := tp_degree_error(getattr(self, name), num_heads, num_kv_heads)):
                raise ValueError(f"{name}: {why}")

    @property
    def candidate_thresholds(self) -> tuple[float, ...]:
        """slo_thresholds parsed: distinct values in (0, 1], highest first."""
        try:
            values = [float(v) for v in self.slo_thresholds.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"slo_thresholds: must be comma-separated numbers, got {self.slo_thresholds!r}") from None
        if not values or not all(0.0 < v <= 1.0 for v in values) or len(set(values)) != len(values):
            raise ValueError(f"slo_thresholds: need distinct values in (0, 1], got {self.slo_thresholds!r}")
        return tuple(sorted(values, reverse=True))

    @property
    def pages_per_worker(self) -> int:
        return self.num_pages if self.num_pages is not None else -(-self.kv_cache_tokens // self.page_size)

    def replace(self, **changes) -> "ServerConfig":
        return dataclasses.replace(self, **changes)

    def worker_policy(self) -> "WorkerPolicy":
        return WorkerPolicy(self.token_budget, self.max_active_decodes, self.credit_share)

    def worker_config(self, hooks: "TestHooks | None" = None) -> "WorkerConfig":
        """What a worker needs of the config, and nothing more (no API key, no HTTP settings)."""
        summarise = self.threshold_policy == "slo" or self.trace_dir is not None
        return WorkerConfig(self.dtype, self.attention_backend, self.enforce_eager, self.block_length, self.cache,
                            self.page_size, self.pages_per_worker, self.worker_policy(),
                            self.candidate_thresholds if summarise else None,
                            self.threshold_policy == "slo" or self.routing != "load",
                            dream_decoding=self.dream_decoding, cpu_kernel_cache_entries=self.cpu_kernel_cache_entries,
                            malloc_trim_s=self.worker_malloc_trim_s, malloc_hold_mb=self.cpu_malloc_hold_mb,
                            fixed_matmul_rows=self.fixed_matmul_rows, block_causal_finalise=self.block_causal_finalise,
                            prefix_caching=self.enable_prefix_caching and self.block_causal_finalise != "recompute",
                            moe_backend=self.moe_backend, hooks=hooks or TestHooks())


SECTIONS: tuple[type, ...] = (ModelConfig, DecodeConfig, SchedulingConfig, ClusterConfig, HTTPConfig, DebugConfig)


@dataclass(frozen=True, slots=True)
class TestHooks:
    """Fault injection for the test suite, never part of a served config: the engine and the offline
    LLM take them as an argument, a `dllm-server serve` subprocess from DLLM_TEST_HOOKS (cli.py)."""
    __test__ = False                  # not a pytest test class
    causal: bool = False              # causal attention: the cache-exactness oracle
    fail_every_n_forwards: int = 0    # every n-th worker forward raises (error paths)
    hang_at_forward: int = 0          # each worker's first process never returns from its n-th forward

    @classmethod
    def parse(cls, text: str) -> "TestHooks":
        """`causal=1,fail_every_n_forwards=23,hang_at_forward=40` (empty: none)."""
        values = {}
        for item in filter(None, (s.strip() for s in text.split(","))):
            name, _, value = item.partition("=")
            if name not in cls.__dataclass_fields__:
                raise ValueError(f"DLLM_TEST_HOOKS: unknown hook {name!r}")
            values[name] = bool(int(value)) if name == "causal" else int(value)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class WorkerPolicy:
    """A worker's scheduling knobs: the starting values come from ServerConfig; the front process
    may change them while serving (the SetPolicy message), applied at the worker's next iteration."""
    token_budget: int | None
    max_active_decodes: int
    credit_share: float

    def __post_init__(self) -> None:
        if self.token_budget is not None and (isinstance(self.token_budget, bool) or self.token_budget < 1):
            raise ValueError(f"token_budget: must be >= 1 or None, got {self.token_budget}")
        if isinstance(self.max_active_decodes, bool) or self.max_active_decodes < 1:
            raise ValueError(f"max_active_decodes: must be >= 1, got {self.max_active_decodes}")
        if not 0 < self.credit_share <= 1:
            raise ValueError(f"credit_share: must be in (0, 1], got {self.credit_share}")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """The worker's view of ServerConfig (ServerConfig.worker_config builds it)."""
    dtype: str
    attention_backend: str
    enforce_eager: bool
    block_length: int            # the default block width (CUDA graphs are captured for it)
    cache: str
    page_size: int
    num_pages: int
    policy: WorkerPolicy
    step_candidates: tuple[float, ...] | None = None   # summarise confidences per step against these
    profile: bool = False              # time a few iterations at start-up (seeds the step-time model)
    dream_decoding: str = "fast_dllm"
    cpu_kernel_cache_entries: int = 0  # 0: leave oneDNN's caches at their defaults
    malloc_trim_s: float = 0.0         # 0: never
    malloc_hold_mb: int = 0            # 0: glibc's defaults
    fixed_matmul_rows: int = 0         # 0: off
    block_causal_finalise: str = "fused"
    prefix_caching: bool = False       # block-causal models only
    moe_backend: str = "torch"
    hooks: TestHooks = TestHooks()


def tp_degree_error(size: int, num_heads: int, num_kv_heads: int) -> str | None:
    """Why `size` cannot shard a model with these head counts (model/tp.py splits both), or None."""
    if size < 1:
        return f"must be >= 1, got {size}"
    if num_heads % size or num_kv_heads % size:
        allowed = [d for d in range(1, 65) if num_heads % d == 0 and num_kv_heads % d == 0]
        return (f"{size} does not divide the model's {num_heads} attention heads and {num_kv_heads} KV heads "
                f"(allowed: {', '.join(map(str, allowed))})")
    return None


def config_fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(ServerConfig)


def section_of(name: str) -> type:
    """The section a ServerConfig field belongs to."""
    return next(s for s in SECTIONS if name in s.__dataclass_fields__)
