"""ServerConfig: the single source of every default (CLI, tests and benchmarks derive from it).

Only plain values live here; runtime facts (mask id, page counts measured on a device) never
come back into the config. Imports nothing from the package and never touches torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

CACHE_MODES = ("none", "prefix", "dual")
DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
DREAM_DECODING = ("fast_dllm", "shifted")


def _f(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True, slots=True)
class ServerConfig:
    # --- model ---
    model: str | None = _f(None, "HF checkpoint folder or Hugging Face model id (ORG/NAME, fetched through "
                           "huggingface_hub: HF_HOME, HF_TOKEN, HF_HUB_OFFLINE apply); none = the embedded demo model")
    revision: str | None = _f(None, "model id only: the branch, tag or commit to fetch (default: main)")
    download_dir: str | None = _f(None, "model id only: the Hugging Face cache folder to use (default: HF_HUB_CACHE, "
                                  "under HF_HOME)")
    generation_config: str | None = _f("auto", "request defaults (temperature, top_p, top_k, min_p, max_new_tokens) "
                                       "and EOS ids from generation_config.json: auto = the model folder's, a folder "
                                       "path = that folder's, none = ignore it (server defaults only)")
    served_model_name: str | None = _f(None, "name reported by /v1/models (default: the model id, else the folder "
                                       "name)")
    dtype: str = _f("auto", "weights and KV dtype: auto (checkpoint's; on CPU fp32 for fp16/bf16 ones), "
                    "float32, bfloat16, float16, float64", choices=DTYPES)
    device: str = _f("auto", "cpu, cuda or auto (cuda when available)", choices=("auto", "cpu", "cuda"))
    attention_backend: str = _f("sdpa", "sdpa (CPU/GPU) or flashinfer (CUDA; falls back to SDPA without CUDA or "
                                "the package; not yet validated on a GPU)",
                                choices=("sdpa", "flashinfer"))
    enforce_eager: bool = _f(False, "CUDA: run decode-only iterations eagerly instead of replaying CUDA graphs "
                             "captured per (batch, block, key length) bucket")
    skip_tokenizer_init: bool = _f(False, "allow a checkpoint without tokenizer files (prompts as token ids)")
    # --- decoding (server-wide defaults; requests may override the sampling ones) ---
    block_length: int = _f(32, "tokens per diffusion block (Fast-dLLM default 32)")
    cache: str = _f("dual", "KV reuse inside a block: none (exact), prefix or dual", choices=CACHE_MODES)
    threshold: float = _f(0.9, "default confidence threshold for parallel commits")
    dream_decoding: str = _f("fast_dllm", "Dream under the prefix / dual cache: fast_dllm (Fast-dLLM's block sampler: "
                             "a block's full forward commits only its first position, cached steps feed from the "
                             "block start) or shifted (dInfer's window from one position earlier; docs/decoding.md)",
                             choices=DREAM_DECODING)
    fixed_matmul_rows: int = _f(0, "run every projection as matmuls of exactly this many rows (the last "
                                "zero-padded), so a row's result never depends on what it is batched with, on "
                                "kernels where it otherwise does (each worker checks at start: /version, "
                                "dllm:batch_invariant; docs/decoding.md). 0: one matmul per projection")
    block_causal_finalise: str = _f("fused", "block-causal families (SDAR): fused writes a finished block's KV in "
                                    "the next block's first forward (exact, a forward a block saved); separate "
                                    "runs a forward of its own for it first (the unfused reference); recompute "
                                    "feeds the whole prefix again at every block (the no-cache reference)",
                                    choices=("fused", "separate", "recompute"))
    enable_prefix_caching: bool = _f(True, "block-causal families (SDAR): share committed prompt KV across "
                                     "requests with the same prefix (exact; LLaDA / Dream never: their prompt KV "
                                     "depends on the answer). Off under block_causal_finalise recompute (it rewrites the prefix)")
    # --- scheduling (per worker) ---
    token_budget: int | None = _f(1024, "tau: tokens per iteration for the deficit scheduler; "
                                  "none = unlimited (prefill priority)")
    max_active_decodes: int = _f(64, "cap on seated in-block decodes per worker iteration")
    credit_share: float = _f(0.125, "share of tau a waiting prefill earns per iteration even when decodes alone "
                             "exceed tau (the starvation bound of the deficit scheduler)")
    # --- SLO-aware decoding (DiLaServe) ---
    threshold_policy: str = _f("fixed", "fixed: every block commits at the request's threshold (else --threshold); "
                               "slo: per block, the highest candidate threshold whose predicted remaining latency "
                               "fits the request's SLO (slo_ms)", choices=("fixed", "slo"))
    slo_thresholds: str = _f("0.95,0.9,0.8,0.7,0.6,0.5", "candidate thresholds of the slo policy, comma-separated")
    default_slo_ms: float | None = _f(None, "SLO of a request that gives no slo_ms; none: such a request decodes at "
                                      "the highest threshold load control allows")
    quality_floor: float = _f(0.5, "the lowest threshold the slo policy and its load control may choose")
    slo_raise_slack: float = _f(0.3, "slo policy: a threshold above --threshold only when its predicted latency "
                                "leaves this share of the request's remaining SLO budget unused, for a request alone on "
                                "its worker, never while load control caps thresholds (docs/slo.md)")
    load_control: bool = _f(True, "slo policy: cap every request's threshold when the worst-case load would "
                            "exceed the cluster's capacity")
    load_target: float = _f(0.7, "load control keeps the needed forward rate within this share of what the "
                            "workers can run within the SLO (headroom for bursts of Poisson-like arrivals)")
    step_predictor: str | None = _f(None, "step predictor artefact (JSON); none: step_predictor.json in the model "
                                    "folder when present, else the simple estimator")
    trace_dir: str | None = _f(None, "write per-step decoding traces (JSONL) to this folder (to train the step "
                               "predictor)")
    # --- KV cache ---
    page_size: int = _f(16, "tokens per KV page")
    num_pages: int | None = _f(None, "KV pages per worker; none = sized from kv_cache_tokens")
    kv_cache_tokens: int = _f(65536, "KV capacity per worker in tokens when num_pages is not set (CPU)")
    # --- placement ---
    placement: str = _f("colocated", "colocated, disaggregated or hybrid",
                        choices=("colocated", "disaggregated", "hybrid"))
    num_workers: int = _f(1, "worker processes (colocated: all; otherwise decode workers)")
    num_prefill_workers: int = _f(1, "prefill workers in disaggregated / hybrid placement")
    distributed_executor_backend: str = _f("mp", "how worker processes start: mp (local subprocesses) or ray "
                                           "(Ray actors on a Ray cluster, maybe on other nodes; docs/multinode.md)",
                                           choices=("mp", "ray"))
    ray_address: str | None = _f(None, "ray only: the cluster to join (auto: the running one on this machine, or "
                                 "HOST:PORT); none: start a local Ray instance")
    ray_placement_strategy: str = _f("PACK", "ray only: placement of the workers' bundles (PACK: as few nodes as "
                                     "possible; SPREAD / STRICT_SPREAD: over nodes, e.g. prefill and decode apart)",
                                     choices=("PACK", "SPREAD", "STRICT_SPREAD", "STRICT_PACK"))
    ray_namespace: str = _f("dllm-server", "ray only: the Ray namespace of this server's actors")
    reconfigure: bool = _f(False, "regroup the devices into instances of other tensor-parallel degrees while "
                           "serving, by DiLaServe's two-stage ILP every reconfigure_period_s (colocated, mp backend, "
                           "slo policy; docs/reconfiguration.md)")
    reconfigure_period_s: float = _f(60.0, "how often the reconfiguration planner decides (bursts shorter than "
                                     "this are load control's)")
    reconfigure_min_gain: float = _f(0.02, "the least gain in mean threshold a regroup must bring (hysteresis)")
    reconfigure_wave_share: float = _f(0.5, "the largest share of the devices a regroup takes out of service at "
                                       "once: it runs in waves, the next draining when the previous wave's new "
                                       "instances serve (an instance that must be formed whole may exceed it; 1: "
                                       "all at once)")
    reconfigure_prior_serial_share: float = _f(0.4, "the planner's prior for a degree no instance has run: the "
                                               "share s of a degree-1 step that tensor parallelism does not "
                                               "shorten, speed-up 1 / (s + (1 - s) / d) (0.4 fits the roofline TP "
                                               "cost model's batch-32 speed-ups 1.4 / 1.8 / 2.1 at TP2 / 4 / 8; 0: "
                                               "the linear 1/d)")
    tensor_parallel_size: int = _f(1, "tensor-parallel degree of every model instance: each instance (a worker as "
                                   "the scheduler sees it) is this many processes, one GPU each on CUDA, sharding "
                                   "heads and MLP rows; must divide the model's attention and KV heads; colocated "
                                   "placement only for now (docs/parallelism.md)")
    kv_transfer: str = _f("layerwise", "disaggregated KV handoff: layerwise (the receiver is picked at "
                          "dispatch and each layer is sent as the prefill forward finishes it) or "
                          "after_prefill (picked and sent once the prefill step is done)",
                          choices=("layerwise", "after_prefill"))
    overflow_threshold_tokens: int = _f(8192, "theta: outstanding prefill tokens past which hybrid overflows")
    routing: str = _f("load", "colocated: route each block to the worker with the fewest outstanding prefill tokens "
                      "(load) or with the earliest predicted completion from its step-time model (completion)",
                      choices=("load", "completion"))
    threads_per_worker: int | None = _f(None, "torch threads per CPU worker; none = (usable cores - 1) / workers")
    # --- server ---
    host: str = _f("127.0.0.1", "bind address")
    port: int = _f(8000, "bind port")
    api_key: str | None = _f(None, "require this bearer key (env DLLM_API_KEY)")
    max_waiting_requests: int = _f(1024, "bounded waiting queue; beyond it requests get 503")
    default_chat_max_tokens: int = _f(128, "max_tokens of a chat request that gives none")
    default_completion_max_tokens: int = _f(16, "max_tokens of a completion request that gives none (OpenAI's 16)")
    allowed_origins: str = _f("*", "CORS allowed origins, comma-separated")
    keep_alive_s: float = _f(10.0, "SSE keep-alive comment after this many seconds of silence")
    shutdown_timeout_s: float = _f(30.0, "SIGTERM drain time; 0 aborts in-flight requests")
    restart_workers: bool = _f(True, "restart a dead worker (else the engine shuts down non-zero)")
    playground: bool = _f(True, "serve the web playground (the canvas being denoised, live) at /playground; "
                          "/ redirects there")
    # --- limits and timeouts (docs/reliability.md) ---
    max_request_body_bytes: int = _f(4 << 20, "largest request body; a bigger one is refused with 413 while it is "
                                     "read, before any parsing")
    body_read_timeout_s: float = _f(30.0, "a request body not received in full within this many seconds: 408")
    max_messages: int = _f(512, "most messages in one chat request")
    max_stop_strings: int = _f(16, "most stop strings in one request")
    max_stop_chars: int = _f(256, "longest stop string, in characters")
    max_prompts_per_request: int = _f(256, "most prompts in one completions request")
    stream_buffer_events: int = _f(512, "events buffered for one stream whose client lags; beyond it the request "
                                   "ends with an error (text streams coalesce and never reach it)")
    socket_send_buffer_bytes: int = _f(256 << 10, "kernel send buffer of each client connection (SO_SNDBUF; 0: "
                                       "autotuned, up to megabytes): what a client that stops reading can leave "
                                       "queued in the kernel before its stream stalls")
    stream_stall_timeout_s: float = _f(30.0, "a streaming client that accepts no data for this many seconds is "
                                       "disconnected and its request aborted (KV freed)")
    worker_stall_timeout_s: float = _f(120.0, "watchdog: a worker with work in flight that reports nothing for this "
                                       "many seconds is killed and treated as dead; 0 turns the watchdog off")
    # --- worker memory (docs/reliability.md) ---
    cpu_kernel_cache_entries: int = _f(64, "CPU workers: bound oneDNN's two per-shape kernel caches (its primitive "
                                       "cache and ideep's, 1024 entries each by default, ~0.3 MB an entry) to this "
                                       "many entries each; bf16/fp16 matmuls of mixed traffic's many shapes fill "
                                       "them and grew a soaked worker by 82 MB in 10 min. 0: the libraries' defaults")
    worker_malloc_trim_s: float = _f(10.0, "a worker that goes idle returns freed heap memory to the OS "
                                     "(glibc malloc_trim) at most this often; 0: never")
    cpu_malloc_hold_mb: int = _f(128, "CPU workers: glibc keeps up to this many MB of freed activations for reuse "
                                 "(its mmap and trim thresholds) instead of page-faulting fresh memory every "
                                 "forward (up to 17 percent of a loaded forward here); the idle trim still returns "
                                 "it. 0: glibc's defaults; at most 2047")
    # --- testing only ---
    causal: bool = _f(False, "TEST ONLY: causal attention (cache-exactness oracle)")
    fail_every_n_forwards: int = _f(0, "TEST ONLY: every n-th worker forward raises (error-path tests)")
    hang_at_forward: int = _f(0, "TEST ONLY: each worker's first process hangs (sleeps forever) in its n-th "
                              "forward; a restarted one does not (watchdog tests)")
    seed: int = _f(0, "seed for requests that give none")

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name}: {why}")

        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices is not None and getattr(self, f.name) not in choices:
                bad(f.name, f"must be one of {', '.join(map(str, choices))}, got {getattr(self, f.name)!r}")
        for name in ("model", "revision", "download_dir", "generation_config", "served_model_name"):
            if getattr(self, name) == "":
                bad(name, "must not be empty (leave it unset for the default)")
        if self.revision is not None and self.model is None:
            bad("revision", "needs a model id (the embedded demo model has no revisions)")
        cands = self.candidate_thresholds          # parses and checks slo_thresholds
        if not 0.0 <= self.quality_floor <= 1.0:
            bad("quality_floor", f"must be in [0, 1], got {self.quality_floor}")
        if not any(c >= self.quality_floor for c in cands):
            bad("quality_floor", f"{self.quality_floor} is above every candidate threshold {cands}")
        if not 0.0 <= self.slo_raise_slack < 1.0:
            bad("slo_raise_slack", f"must be in [0, 1), got {self.slo_raise_slack}")
        if not 0.1 <= self.load_target <= 1.0:
            bad("load_target", f"must be in [0.1, 1], got {self.load_target}")
        if self.default_slo_ms is not None and not self.default_slo_ms > 0:
            bad("default_slo_ms", f"must be > 0 or None, got {self.default_slo_ms}")
        if self.block_length < 1:
            bad("block_length", f"must be >= 1, got {self.block_length}")
        if not 0.0 <= self.threshold <= 1.0:
            bad("threshold", f"must be in [0, 1], got {self.threshold}")
        self.worker_policy()          # token_budget, max_active_decodes, credit_share
        if self.page_size < 1:
            bad("page_size", f"must be >= 1, got {self.page_size}")
        if self.num_pages is not None and self.num_pages < 1:
            bad("num_pages", f"must be >= 1 or None, got {self.num_pages}")
        if self.kv_cache_tokens < self.page_size:
            bad("kv_cache_tokens", f"must be >= page_size, got {self.kv_cache_tokens}")
        if self.num_workers < 1:
            bad("num_workers", f"must be >= 1, got {self.num_workers}")
        if self.num_prefill_workers < 1:
            bad("num_prefill_workers", f"must be >= 1, got {self.num_prefill_workers}")
        if isinstance(self.tensor_parallel_size, bool) or self.tensor_parallel_size < 1:
            bad("tensor_parallel_size", f"must be >= 1, got {self.tensor_parallel_size}")
        if self.reconfigure and (self.placement != "colocated" or self.distributed_executor_backend != "mp"
                                 or self.threshold_policy != "slo"):
            bad("reconfigure", "needs colocated placement, the mp backend and --threshold-policy slo (the planner "
                "plans thresholds; disaggregated workers hand KV between fixed pairs; ray fixes its bundles)")
        if not self.reconfigure_period_s > 0:
            bad("reconfigure_period_s", f"must be > 0, got {self.reconfigure_period_s}")
        if not 0 <= self.reconfigure_min_gain < 1:
            bad("reconfigure_min_gain", f"must be in [0, 1), got {self.reconfigure_min_gain}")
        if not 0 < self.reconfigure_wave_share <= 1:
            bad("reconfigure_wave_share", f"must be in (0, 1], got {self.reconfigure_wave_share}")
        if not 0 <= self.reconfigure_prior_serial_share < 1:
            bad("reconfigure_prior_serial_share", f"must be in [0, 1), got {self.reconfigure_prior_serial_share}")
        if self.tensor_parallel_size > 1 and self.placement != "colocated":
            bad("tensor_parallel_size", f"{self.tensor_parallel_size} with {self.placement} placement is not supported "
                "yet (its KV handoff moves whole-model pages between single-process workers): use colocated "
                "placement, or tensor_parallel_size 1")
        if self.overflow_threshold_tokens < 0:
            bad("overflow_threshold_tokens", f"must be >= 0, got {self.overflow_threshold_tokens}")
        if not 0 < self.port < 65536:
            bad("port", f"must be in 1..65535, got {self.port}")
        if self.max_waiting_requests < 1:
            bad("max_waiting_requests", f"must be >= 1, got {self.max_waiting_requests}")
        if self.shutdown_timeout_s < 0:
            bad("shutdown_timeout_s", f"must be >= 0, got {self.shutdown_timeout_s}")
        for name in ("max_request_body_bytes", "max_messages", "max_stop_strings", "max_stop_chars",
                     "max_prompts_per_request", "stream_buffer_events"):
            if getattr(self, name) < 1:
                bad(name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("body_read_timeout_s", "stream_stall_timeout_s"):
            if not getattr(self, name) > 0:
                bad(name, f"must be > 0, got {getattr(self, name)}")
        for name, zero in (("socket_send_buffer_bytes", " (0: autotuned)"), ("worker_stall_timeout_s", " (0: off)"),
                           ("hang_at_forward", ""), ("cpu_kernel_cache_entries", " (0: library defaults)"),
                           ("worker_malloc_trim_s", " (0: never)"), ("cpu_malloc_hold_mb", " (0: glibc's defaults)"),
                           ("fixed_matmul_rows", " (0: off)")):
            if getattr(self, name) < 0:
                bad(name, f"must be >= 0{zero}, got {getattr(self, name)}")
        if self.cpu_malloc_hold_mb > 2047:      # glibc's thresholds are C ints
            bad("cpu_malloc_hold_mb", f"must be <= 2047, got {self.cpu_malloc_hold_mb}")

    def check_model_heads(self, num_heads: int, num_kv_heads: int) -> None:
        """The rules that need the model's head counts (read from its config.json before any
        weights load)."""
        why = tp_degree_error(self.tensor_parallel_size, num_heads, num_kv_heads)
        if why:
            raise ValueError(f"tensor_parallel_size: {why}")

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
        if self.num_pages is not None:
            return self.num_pages
        return -(-self.kv_cache_tokens // self.page_size)

    def replace(self, **changes) -> "ServerConfig":
        return dataclasses.replace(self, **changes)

    def worker_policy(self) -> "WorkerPolicy":
        return WorkerPolicy(self.token_budget, self.max_active_decodes, self.credit_share)

    def worker_config(self) -> "WorkerConfig":
        """What a worker needs of the config, and nothing more (no API key, no HTTP settings)."""
        summarise = self.threshold_policy == "slo" or self.trace_dir is not None
        return WorkerConfig(self.dtype, self.attention_backend, self.enforce_eager, self.block_length, self.cache,
                            self.page_size, self.pages_per_worker, self.worker_policy(), self.causal,
                            self.fail_every_n_forwards, self.candidate_thresholds if summarise else None,
                            self.threshold_policy == "slo" or self.routing == "completion",
                            dream_decoding=self.dream_decoding, hang_at_forward=self.hang_at_forward,
                            cpu_kernel_cache_entries=self.cpu_kernel_cache_entries,
                            malloc_trim_s=self.worker_malloc_trim_s, malloc_hold_mb=self.cpu_malloc_hold_mb,
                            fixed_matmul_rows=self.fixed_matmul_rows, tensor_parallel_size=self.tensor_parallel_size,
                            block_causal_finalise=self.block_causal_finalise,
                            prefix_caching=self.enable_prefix_caching and self.block_causal_finalise != "recompute")


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
    causal: bool = False
    fail_every_n_forwards: int = 0
    step_candidates: tuple[float, ...] | None = None   # summarise confidences per step against these
    profile: bool = False              # time a few iterations at start-up (seeds the step-time model)
    dream_decoding: str = "fast_dllm"  # ServerConfig.dream_decoding
    hang_at_forward: int = 0           # TEST ONLY: the n-th forward of each worker's first process never returns
    cpu_kernel_cache_entries: int = 0  # ServerConfig's; 0: leave oneDNN's caches at their defaults
    malloc_trim_s: float = 0.0         # ServerConfig.worker_malloc_trim_s; 0: never
    malloc_hold_mb: int = 0            # ServerConfig.cpu_malloc_hold_mb; 0: glibc's defaults
    fixed_matmul_rows: int = 0         # ServerConfig.fixed_matmul_rows; 0: off
    tensor_parallel_size: int = 1      # ranks of this worker's instance (worker/tp.py)
    block_causal_finalise: str = "fused"   # ServerConfig.block_causal_finalise
    prefix_caching: bool = False       # ServerConfig.enable_prefix_caching (block-causal models only)


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
