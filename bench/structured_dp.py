"""The structured-output automaton's costs outside the server (docs/structured_output.md): per committed schema,
the compile time (outlines-core's index plus our token classes), its states, token classes and class edges, and
the block dynamic program's milliseconds for one 32-position block with every position open (the most it
does), on the demo model's 4096-token vocabulary and on a synthetic 150k-token one (random printable byte
strings of 1 to 8 bytes plus the 256 bytes: a stand-in for a real BPE vocabulary, labelled as such). Also:
indexing our json_object expression against outlines-core's generic {"type": "object"} one, and the longest
gap a thread sleeping 10 ms sees while outlines-core indexes the latter in another thread (does it hold the GIL?).

    python -m bench.structured_dp --json docs/results/structured/dp.json
"""
from __future__ import annotations

import random
import statistics

import torch

from bench.harness import Report, Timer, parser
from bench.structured import load_schemas


def synthetic_vocab(size: int, seed: int = 0) -> dict[bytes, list[int]]:
    rng = random.Random(seed)
    vocab = {bytes([b]): [b] for b in range(256)}
    printable = [c for c in range(32, 127)]
    while len(vocab) < size:
        w = bytes(rng.choice(printable) for _ in range(rng.randint(2, 8)))
        vocab.setdefault(w, [len(vocab)])
    return vocab


def main() -> None:
    from dllm_server.checkpoint import embedded_model_path
    from dllm_server.decoding.params import StructuredOutputs
    from dllm_server.structured.automaton import TokenAutomaton
    from dllm_server.structured.schema import regex_for
    from dllm_server.structured.vocab import vocab_of
    from outlines_core.json_schema import build_regex_from_schema

    ap = parser(__doc__, threads=1, json_out=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--big-vocab", type=int, default=150_000)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    vocabs = {"demo 4096": (vocab_of(str(embedded_model_path())), 4096, (0, 4)),
              f"synthetic {args.big_vocab // 1000}k": (synthetic_vocab(args.big_vocab), args.big_vocab + 2,
                                                       (args.big_vocab, args.big_vocab + 1))}
    report = Report(args.json, threads=args.threads, block=32)
    summary = report.table(["vocabulary", ("compile s median", ".3f"), ("compile s max", ".3f"),
                            ("DP ms median", ".2f"), ("DP ms max", ".2f"), ("classes median", ".0f"),
                            ("class edges median", ".0f"), ("token edges median", ".0f")],
                           title="per schema, over the committed schemas (SIMULATED scores: random logits)")
    rng = torch.Generator().manual_seed(0)
    for name, (vocab, v_size, stops) in vocabs.items():
        compile_s, dp_ms, classes, edges, token_edges = [], [], [], [], []
        for it in load_schemas():
            spec = StructuredOutputs(json=it["schema"]) if it["schema"] is not None else \
                StructuredOutputs(json_object=True)
            rx = regex_for(spec)
            with Timer() as t:
                a = TokenAutomaton(rx, vocab, stops, v_size)
                a.tensors(torch.device("cpu"))
            compile_s.append(t.s)
            classes.append(a.num_classes)
            edges.append(a.tensors(torch.device("cpu"))[0].numel())
            token_edges.append(a.num_transitions)
            times = []
            for _ in range(args.reps):
                scores = torch.log_softmax(3 * torch.randn(32, v_size, generator=rng, dtype=torch.float64), -1)
                with Timer() as t:
                    a.best_assignment(scores, [None] * 32, 0, 0, None, 96)
                times.append(1e3 * t.s)
            dp_ms.append(statistics.median(times))
        summary.row(name, statistics.median(compile_s), max(compile_s), statistics.median(dp_ms), max(dp_ms),
                    statistics.median(classes), statistics.median(edges), statistics.median(token_edges))
    index_table = report.table(["vocabulary", ("our json_object s", ".3f"), ('outlines {"type": "object"} s', ".3f"),
                                ("longest 10-ms sleeper gap s", ".3f")], title="indexing a generic JSON object")
    for name, (vocab, v_size, stops) in vocabs.items():
        ours = _index_s(regex_for(StructuredOutputs(json_object=True)), vocab, stops[0])
        generic = build_regex_from_schema('{"type": "object"}')
        theirs, gap = _index_s(generic, vocab, stops[0], watch=True)
        index_table.row(name, ours[0], theirs, gap)
    report.save()


def _index_s(regex: str, vocab: dict, eos: int, watch: bool = False):
    """Seconds outlines-core takes to index `regex`; with `watch`, built in a thread while this one sleeps 10 ms
    at a time, and the longest wake-up gap seen (about 0.01 s when the build leaves the GIL free)."""
    import threading
    import time
    from outlines_core import Index, Vocabulary
    took = []

    def build():
        t0 = time.perf_counter()
        Index(regex, Vocabulary(eos, vocab))
        took.append(time.perf_counter() - t0)
    th = threading.Thread(target=build)
    th.start()
    gap, last = 0.0, time.perf_counter()
    while th.is_alive():
        time.sleep(0.01)
        now = time.perf_counter()
        gap, last = max(gap, now - last), now
    th.join()
    return (took[0], gap) if watch else (took[0],)


if __name__ == "__main__":
    main()
