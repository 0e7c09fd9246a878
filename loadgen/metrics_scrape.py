"""Server-side view: scrape Prometheus ``/metrics``, ``/version`` and ``/v1/models``.

Owns: fetching these endpoints (tolerating their absence), parsing Prometheus text with
``prometheus_client.parser.text_string_to_metric_families``, and the before/after deltas of the
cumulative ``dllm:`` series (counters, untyped ``*_total`` series, and the ``_count``/``_sum`` of
histograms and summaries). Gauges are not deltas and are left out.
"""
from __future__ import annotations

import httpx

PREFIX = "dllm:"


def server_root(base_url: str) -> str:
    """``http://h:p/v1`` or ``http://h:p/`` -> ``http://h:p``."""
    root = base_url.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


def _key(name: str, labels: dict) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def parse_cumulative(text: str, prefix: str = PREFIX) -> dict[str, float]:
    """Cumulative samples whose name starts with ``prefix``, keyed ``name{labels}``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(prefix):
            continue
        for s in fam.samples:
            keep = (fam.type == "counter" and not s.name.endswith("_created")) or (
                fam.type in ("histogram", "summary") and s.name.endswith(("_count", "_sum"))) or (
                # "# TYPE x counter" followed by "x_total" parses as an untyped family
                fam.type in ("unknown", "untyped") and s.name.endswith("_total"))
            if keep:
                out[_key(s.name, s.labels)] = float(s.value)
    return out


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before for every series seen after the run (missing before counts as 0)."""
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after)}


async def scrape_metrics(client: httpx.AsyncClient, base_url: str) -> tuple[dict | None, str]:
    """(series, note); series is None when ``/metrics`` is missing or unparsable."""
    url = server_root(base_url) + "/metrics"
    try:
        resp = await client.get(url, timeout=10.0)
    except httpx.HTTPError as exc:
        return None, f"{url} unreachable: {type(exc).__name__}: {exc}"
    if resp.status_code != 200:
        return None, f"{url} returned HTTP {resp.status_code}"
    try:
        return parse_cumulative(resp.text), "ok"
    except Exception as exc:  # noqa: BLE001 - a bad exposition must not stop the benchmark
        return None, f"{url} not Prometheus text: {exc}"


def metrics_report(before: tuple[dict | None, str], after: tuple[dict | None, str]) -> dict:
    if before[0] is None or after[0] is None:
        note = before[1] if before[0] is None else after[1]
        return {"available": False, "note": note, "deltas": {}}
    return {"available": True, "note": "ok", "deltas": deltas(before[0], after[0])}


async def server_info(client: httpx.AsyncClient, base_url: str, headers: dict) -> dict:
    """``/version`` (JSON or text) and the model ids of ``/v1/models``; None where missing."""
    root = server_root(base_url)
    info: dict = {"version": None, "models": []}
    try:
        resp = await client.get(root + "/version", headers=headers, timeout=10.0)
        if resp.status_code == 200:
            try:
                info["version"] = resp.json()
            except ValueError:
                info["version"] = resp.text.strip()[:200]
    except httpx.HTTPError:
        pass
    try:
        resp = await client.get(root + "/v1/models", headers=headers, timeout=10.0)
        if resp.status_code == 200:
            data = resp.json().get("data", [])
            info["models"] = [m.get("id") for m in data if isinstance(m, dict)]
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return info
