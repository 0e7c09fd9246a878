"""Structured output served over HTTP (docs/structured_output.md): the committed schemas
(bench/data/structured_schemas.json) on the demo model and tiny LLaDA, Dream and SDAR checkpoints, at
each threshold, streamed and not, each request beside the same request unconstrained. Prints, per model,
threshold and mode: answers that parse and validate (jsonschema, formats checked), forwards per answer and
tokens per forward constrained vs unconstrained, and the dynamic program's milliseconds per forward (the
`dllm.constraint` summary the server returns).

    python -m bench.structured --json docs/results/structured/served.json
"""
from __future__ import annotations

import json
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.harness import Report, Timer, parser, server

SCHEMAS = Path(__file__).resolve().parent / "data" / "structured_schemas.json"
PROMPT = "Answer with one JSON document."


def load_schemas() -> list[dict]:
    return json.loads(SCHEMAS.read_text())


def response_format(item: dict) -> dict:
    if item["schema"] is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": item["name"], "schema": item["schema"]}}


def violation(item: dict, text: str) -> str | None:
    """Why `text` is not a valid answer for `item` (None: it parses and validates, formats included)."""
    import jsonschema
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON: {e}"
    schema = item["schema"] if item["schema"] is not None else {"type": "object"}
    try:
        jsonschema.validate(doc, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    except jsonschema.ValidationError as e:
        return f"invalid: {e.message}"
    return None


def ask(url: str, body: dict, stream: bool) -> tuple[str, dict]:
    """The answer's text and its `dllm` summary, as a client reads them (a stream's deltas joined)."""
    import httpx
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        c = r.json()["choices"][0]
        return c["message"]["content"], c["dllm"]
    text, summary = [], {}
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    text.append(c["delta"].get("content") or "")
                    summary = c.get("dllm", summary)
    return "".join(text), summary


def run(url: str, items: list[dict], threshold: float, stream: bool, max_tokens: int, concurrency: int = 8
        ) -> dict:
    """Every schema constrained and the same request unconstrained, sent together (batched)."""
    base = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "threshold": threshold}
    bodies = [{**base, "response_format": response_format(it)} for it in items] + [base] * len(items)
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(lambda b: ask(url, b, stream), bodies))
    con, unc = answers[: len(items)], answers[len(items):]
    failures = [(it["name"], text, why) for it, (text, _) in zip(items, con) if (why := violation(it, text))]

    def per(ans, key):
        return statistics.mean(s[key] for _, s in ans)

    dp = [s["constraint"]["dp_ms_per_forward"] for _, s in con if "constraint" in s]
    return {"valid": len(items) - len(failures), "of": len(items), "failures": failures,
            "forwards": per(con, "forwards"), "forwards_unconstrained": per(unc, "forwards"),
            "tokens_per_forward": per(con, "tokens_per_forward"),
            "tokens_per_forward_unconstrained": per(unc, "tokens_per_forward"),
            "dp_ms_per_forward": statistics.mean(dp) if dp else 0.0}


def tiny(arch: str, folder: Path) -> str:
    from dllm_server.model.tiny import make_tiny_model
    return str(make_tiny_model(folder / arch, arch=arch, seed={"llada": 0, "dream": 1, "sdar": 2}[arch]))


def main() -> None:
    ap = parser(__doc__, json_out=True)
    ap.add_argument("--models", default="demo,llada,dream,sdar", help="demo and/or tiny llada, dream, sdar")
    ap.add_argument("--thresholds", default="0.9,0.5")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    items = load_schemas()
    report = Report(args.json, schemas=len(items), max_tokens=args.max_tokens)
    table = report.table(["model", "threshold", "stream", "valid", ("forwards", ".1f"), ("forwards unc.", ".1f"),
                          ("tok/fwd", ".2f"), ("tok/fwd unc.", ".2f"), ("DP ms/fwd", ".2f"), ("wall s", ".1f")])
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model = None if name == "demo" else tiny(name, Path(tmp))
            flags = ("--threads-per-worker", "1") + (() if name == "demo" else ("--block-length", "8"))
            with server(model, *flags) as s:
                for th in map(float, args.thresholds.split(",")):
                    for stream in (False, True):
                        with Timer() as t:
                            r = run(s.url, items, th, stream, args.max_tokens)
                        failures += [(name, th, stream, *f) for f in r["failures"]]
                        table.row(name, th, "yes" if stream else "no", f"{r['valid']}/{r['of']}", r["forwards"],
                                  r["forwards_unconstrained"], r["tokens_per_forward"],
                                  r["tokens_per_forward_unconstrained"], r["dp_ms_per_forward"], t.s)
    for f in failures:
        print("FAILED", *f)
    report.add(failures=failures)
    report.save()


if __name__ == "__main__":
    main()
