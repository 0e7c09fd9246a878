"""dllm-server load generator: async streaming benchmarks of OpenAI-compatible servers.

Modules: ``arrivals`` (when), ``workload`` (what), ``client`` (one SSE request), ``run`` (one
measurement), ``stats`` (numbers), ``report`` (JSON + tables), ``metrics_scrape`` (server
``/metrics``), ``capacity`` (pure capacity search), ``sweep`` (modes), ``plots`` (PNGs),
``tokens`` (client-side token counts), ``cli`` (flags). Run ``python -m loadgen --help``.
"""
__version__ = "0.1.0"
