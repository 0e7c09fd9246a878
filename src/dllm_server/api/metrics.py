"""Prometheus metrics (`dllm:` names, plus the `vllm:diffusion_*` counters that `vllm bench serve`
reads). Histograms and counters are observed in the front process when a request finishes;
gauges and worker figures are collected from engine state at scrape time."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class EngineCollector:
    def __init__(self, engine, model_name: str):
        self.engine = engine
        self.model = model_name

    def collect(self):
        labels = ["model_name"]
        running = GaugeMetricFamily("dllm:num_requests_running", "requests with a block on a worker", labels=labels)
        waiting = GaugeMetricFamily("dllm:num_requests_waiting", "requests not yet started", labels=labels)
        leases = GaugeMetricFamily("dllm:block_leases", "next blocks leased to the worker holding the request",
                                   labels=labels)
        usage = GaugeMetricFamily("dllm:kv_cache_usage_perc", "used fraction of all KV pages", labels=labels)
        budget = GaugeMetricFamily("dllm:worker_iteration_tokens", "tokens fed by a worker's last iteration",
                                   labels=labels + ["worker"])
        deficit = GaugeMetricFamily("dllm:worker_deficit_tokens", "deficit carried by a worker's scheduler",
                                    labels=labels + ["worker"])
        tau = GaugeMetricFamily("dllm:worker_token_budget", "a worker's token budget tau (0: unlimited)",
                                labels=labels + ["worker"])
        seats = GaugeMetricFamily("dllm:worker_max_active_decodes", "a worker's decode seat cap",
                                  labels=labels + ["worker"])
        healthy = GaugeMetricFamily("dllm:worker_up", "1 when the worker is ready and alive", labels=labels + ["worker"])
        tp_size = GaugeMetricFamily("dllm:instance_tp_size", "tensor-parallel degree of a worker (model instance): "
                                    "its processes", labels=labels + ["worker"])
        pages = GaugeMetricFamily("dllm:worker_kv_pages", "KV pages of a worker (the same page table on each of "
                                  "its ranks, each holding its own heads)", labels=labels + ["worker"])
        invariant = GaugeMetricFamily("dllm:batch_invariant", "1 when the worker's start-up self-check found its "
                                      "projections batch-invariant (results bitwise independent of batching and "
                                      "placement), 0 when not", labels=labels + ["worker"])
        pc_hits = CounterMetricFamily("dllm:prefix_cache_hits", "prompt tokens whose KV came from the prefix cache "
                                      "(block-causal models; since the worker started)", labels=labels + ["worker"])
        pc_queries = CounterMetricFamily("dllm:prefix_cache_queries", "prompt tokens looked up in the prefix cache",
                                         labels=labels + ["worker"])
        pc_pages = GaugeMetricFamily("dllm:prefix_cache_pages", "KV pages the prefix cache holds (referenced or "
                                     "not)", labels=labels + ["worker"])
        pc_evicted = CounterMetricFamily("dllm:prefix_cache_evicted_pages", "cached pages reclaimed under memory "
                                         "pressure", labels=labels + ["worker"])
        xfer_b = CounterMetricFamily("dllm:kv_transfer_bytes", "KV bytes sent between workers", labels=labels)
        xfer_s = CounterMetricFamily("dllm:kv_transfer_seconds", "seconds spent sending KV", labels=labels)
        handoffs = CounterMetricFamily("dllm:kv_handoffs", "blocks moved to a decode worker", labels=labels)
        stall = CounterMetricFamily("dllm:kv_handoff_stall_seconds", "prefill step done -> first decode step on "
                                    "the decode worker, summed over handoffs", labels=labels)
        continued = CounterMetricFamily("dllm:blocks_continued", "next blocks queued on the worker that held the "
                                        "request (no trip through the router)", labels=labels)
        cap = GaugeMetricFamily("dllm:threshold_cap", "the slo policy's load-control cap on every threshold",
                                labels=labels)
        pred_err = GaugeMetricFamily("dllm:predictor_mae_forwards", "the step predictor's mean absolute error of "
                                     "remaining forwards, over recent finished requests", labels=labels + ["when"])
        step_err = GaugeMetricFamily("dllm:step_time_rel_error", "the step-time model's mean relative error on "
                                     "recent iterations", labels=labels)
        ticks = CounterMetricFamily("dllm:scheduler_ticks", "worker message batches the scheduler handled",
                                    labels=labels)
        tick_s = CounterMetricFamily("dllm:scheduler_tick_seconds", "front-loop seconds spent handling them",
                                     labels=labels)
        restarts = CounterMetricFamily("dllm:worker_restarts", "worker deaths the engine restarted from",
                                       labels=labels)
        regroups = CounterMetricFamily("dllm:reconfigurations", "live regroups of the instances done", labels=labels)
        drains = CounterMetricFamily("dllm:drain_seconds", "seconds instances spent draining for regroups, summed",
                                     labels=labels)
        evicted = CounterMetricFamily("dllm:blocks_evicted", "blocks taken back from a draining instance before "
                                      "they started (run elsewhere)", labels=labels)
        instances = GaugeMetricFamily("dllm:instances", "model instances serving, by tensor-parallel degree",
                                      labels=labels + ["tp_size"])
        hangs = CounterMetricFamily("dllm:worker_hangs", "workers the watchdog killed: no progress with work in "
                                    "flight for worker_stall_timeout_s", labels=labels)
        resumed = CounterMetricFamily("dllm:requests_resumed", "requests whose worker died under them, redone from "
                                      "their block's start on another worker or the restarted one", labels=labels)
        yielded = CounterMetricFamily("dllm:requests_yielded", "requests with an SLO moved back in line once it could "
                                      "no longer be met (deadline scheduling; still served, slo_met false)",
                                      labels=labels)
        overflowed = CounterMetricFamily("dllm:streams_overflowed", "requests ended because their consumer let "
                                         "stream_buffer_events events pile up", labels=labels)
        canvas = CounterMetricFamily("dllm:canvas_positions", "positions fed through the model", labels=labels)
        canvas_v = CounterMetricFamily("vllm:diffusion_num_canvas_positions", "positions fed through the model",
                                       labels=labels)
        if self.engine.is_started:
            s = self.engine.stats()
            m = [self.model]
            running.add_metric(m, s.num_running)
            waiting.add_metric(m, s.num_waiting)
            leases.add_metric(m, s.num_leased)
            usage.add_metric(m, s.kv_usage)
            for w in s.workers:
                wl = m + [str(w.worker_id)]
                budget.add_metric(wl, w.iteration_tokens)
                deficit.add_metric(wl, w.deficit_tokens)
                tau.add_metric(wl, w.policy.token_budget or 0)
                seats.add_metric(wl, w.policy.max_active_decodes)
                healthy.add_metric(wl, 1.0 if w.up else 0.0)
                tp_size.add_metric(wl, w.tp_size)
                pages.add_metric(wl, w.num_pages)
                if w.row_invariance is not None:
                    invariant.add_metric(wl, 1.0 if w.row_invariance.holds else 0.0)
                if w.prefix_cache is not None:
                    hits, queries, cached, evicted_pages = w.prefix_cache
                    pc_hits.add_metric(wl, hits)
                    pc_queries.add_metric(wl, queries)
                    pc_pages.add_metric(wl, cached)
                    pc_evicted.add_metric(wl, evicted_pages)
            c = s.counters
            xfer_b.add_metric(m, c.kv_transfer_bytes)
            xfer_s.add_metric(m, c.kv_transfer_seconds)
            handoffs.add_metric(m, c.kv_handoffs)
            stall.add_metric(m, c.kv_handoff_stall_seconds)
            continued.add_metric(m, c.blocks_continued)
            restarts.add_metric(m, c.worker_restarts)
            regroups.add_metric(m, c.reconfigurations)
            drains.add_metric(m, c.drain_seconds)
            evicted.add_metric(m, c.blocks_evicted)
            by_tp: dict[int, int] = {}
            for w in s.workers:
                if w.up:
                    by_tp[w.tp_size] = by_tp.get(w.tp_size, 0) + 1
            for d, n in sorted(by_tp.items()):
                instances.add_metric(m + [str(d)], n)
            hangs.add_metric(m, c.worker_hangs)
            overflowed.add_metric(m, c.streams_overflowed)
            yielded.add_metric(m, c.requests_yielded)
            resumed.add_metric(m, c.requests_resumed)
            canvas.add_metric(m, c.canvas_positions)
            canvas_v.add_metric(m, c.canvas_positions)
            ticks.add_metric(m, s.ticks)
            tick_s.add_metric(m, s.tick_s)
            p = s.policy
            if p is not None:
                cap.add_metric(m, p["cap"])
                for when, v in p["mae_forwards"].items():
                    if v is not None:
                        pred_err.add_metric(m + [when], v)
                if p["step_time_rel_error"] is not None:
                    step_err.add_metric(m, p["step_time_rel_error"])
        yield from (running, waiting, leases, usage, budget, deficit, tau, seats, healthy, tp_size, pages, invariant, xfer_b, xfer_s, handoffs, stall,
                    continued, cap, pred_err, step_err, ticks, tick_s, canvas, canvas_v, restarts, hangs, overflowed,
                    regroups, drains, evicted, instances, pc_hits, pc_queries, pc_pages, pc_evicted, yielded,
                    resumed)


class Metrics:
    def __init__(self, engine, model_name: str):
        self.registry = CollectorRegistry()
        r, m = self.registry, ["model_name"]
        self.model = model_name
        self.ttft = Histogram("dllm:time_to_first_token_seconds", "time to first committed text", m,
                              registry=r, buckets=LATENCY_BUCKETS)
        self.e2e = Histogram("dllm:e2e_request_latency_seconds", "request latency", m, registry=r,
                             buckets=LATENCY_BUCKETS)
        self.queue = Histogram("dllm:request_queue_time_seconds", "arrival to first step", m, registry=r,
                               buckets=LATENCY_BUCKETS)
        self.tpf = Histogram("dllm:tokens_per_forward", "committed tokens per forward, per request", m,
                             registry=r, buckets=(1, 1.5, 2, 3, 4, 6, 8, 12, 16, 32))
        self.steps_per_block = Histogram("dllm:steps_per_block", "forwards per block", m, registry=r,
                                         buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64))
        self.slo_met = Counter("dllm:slo_met", "finished requests with an SLO that met it", m, registry=r)
        self.slo_missed = Counter("dllm:slo_missed", "finished requests with an SLO that missed it", m, registry=r)
        self.block_threshold = Histogram("dllm:block_threshold", "the confidence threshold each block ran with", m,
                                         registry=r, buckets=(0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0))
        self.prompt_tokens = Counter("dllm:prompt_tokens", "prompt tokens", m, registry=r)
        self.generation_tokens = Counter("dllm:generation_tokens", "output tokens", m, registry=r)
        self.success = Counter("dllm:request_success", "finished requests", m + ["finished_reason"], registry=r)
        self.steps = Counter("dllm:denoising_steps", "forwards run for requests (per request)", m, registry=r)
        self.committed = Counter("dllm:committed_tokens", "positions committed", m, registry=r)
        self.v_steps = Counter("vllm:diffusion_num_denoising_steps", "denoising steps", m, registry=r)
        self.v_committed = Counter("vllm:diffusion_num_committed_tokens", "committed tokens", m, registry=r)
        self.error_responses = Counter("dllm:error_responses", "error responses sent before any generation output "
                                       "(invalid 400, too large 413, overloaded 503, ...)", m + ["code"], registry=r)
        self.streams_stalled = Counter("dllm:streams_stalled", "streams dropped because the client read nothing for "
                                       "stream_stall_timeout_s", m, registry=r)
        r.register(EngineCollector(engine, model_name))

    def observe_finished(self, output, arrived_at: float, first_step_at: float | None,
                         first_text_at: float | None, finished_at: float, slo_ms: float | None = None) -> None:
        m = self.model
        if slo_ms is not None and output.finish_reason in ("stop", "length"):
            met = 1e3 * (finished_at - arrived_at) <= slo_ms
            (self.slo_met if met else self.slo_missed).labels(m).inc()
        for p in output.stats.block_policies:
            self.block_threshold.labels(m).observe(p.threshold)
        self.e2e.labels(m).observe(finished_at - arrived_at)
        if first_step_at is not None:
            self.queue.labels(m).observe(first_step_at - arrived_at)
        if first_text_at is not None:
            self.ttft.labels(m).observe(first_text_at - arrived_at)
        self.prompt_tokens.labels(m).inc(len(output.prompt_token_ids))
        self.generation_tokens.labels(m).inc(len(output.token_ids))
        self.success.labels(m, output.finish_reason).inc()
        stats = output.stats
        self.steps.labels(m).inc(stats.num_forwards)
        self.v_steps.labels(m).inc(stats.num_forwards)
        self.committed.labels(m).inc(stats.num_committed)
        self.v_committed.labels(m).inc(stats.num_committed)
        if stats.num_forwards:
            self.tpf.labels(m).observe(output.tokens_per_forward)
        for s in stats.steps_per_block:
            self.steps_per_block.labels(m).observe(s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
