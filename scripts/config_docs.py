"""Writes docs/configuration.md from ServerConfig: one table per section, every flag with its
default and help (tests/test_cli.py checks the committed page is current).

    python scripts/config_docs.py            # rewrite docs/configuration.md
    python scripts/config_docs.py --check    # exit 1 if it is out of date
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from dllm_server.config import SECTIONS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def render() -> str:
    out = ["# Configuration", "",
           "Every `dllm-server serve` flag, by section, generated from `src/dllm_server/config.py` by",
           "`python scripts/config_docs.py`. `ServerConfig` is the union of the sections: the offline `LLM(...)`,",
           "`AsyncEngine` and the benchmarks take the same names as keyword arguments (`block_length=8` for",
           "`--block-length 8`). A bad value is refused with a message naming the field. `none` sets an",
           "optional value to None.", ""]
    for section in SECTIONS:
        out += [f"## {section.SECTION}", "", section.__doc__.strip(), "", "| flag | default | meaning |",
                "|---|---|---|"]
        for f in dataclasses.fields(section):
            flag = "`MODEL` (positional)" if f.name == "model" else f"`--{f.name.replace('_', '-')}`"
            meaning = f.metadata["help"].replace("|", "\\|")
            rules = [f"one of {', '.join(map(str, f.metadata['choices']))}"] if "choices" in f.metadata else []
            rules += [f"{sym} {f.metadata[k]}" for k, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
                      if k in f.metadata]
            if rules:
                meaning += f" ({'; '.join(rules)})"
            out.append(f"| {flag} | `{f.default}` | {meaning} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        current = PAGE.read_text() if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE} is out of date: run python scripts/config_docs.py")
            return 1
        print(f"{PAGE} is current")
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
