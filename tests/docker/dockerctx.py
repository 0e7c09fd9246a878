"""Helpers for the Docker packaging tests: Dockerfile instructions, .dockerignore matching, context files.

Dockerfiles are parsed with the `dockerfile` package (BuildKit's own Go parser) when it is
installed, else with the small line parser below (enough for our files: continuations, comments,
JSON and shell forms, --flags). .dockerignore matching follows moby's patternmatcher: patterns
are cleaned and anchored at the context root, `*`/`?` stop at `/`, `**` spans directories, a
pattern that matches a parent directory matches everything under it, `!` re-includes, and the
last matching pattern wins.
"""
from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
DOCKERFILES = {"cuda": DOCKER_DIR / "Dockerfile", "cpu": DOCKER_DIR / "Dockerfile.cpu"}
COMPOSE_FILE = DOCKER_DIR / "compose.yaml"
DOCKERIGNORE = REPO / ".dockerignore"


@dataclasses.dataclass(frozen=True)
class Instruction:
    cmd: str                 # upper case: FROM, COPY, ...
    flags: tuple[str, ...]   # --from=build, --chown=...
    value: tuple[str, ...]   # arguments (JSON form: the list; shell form: one string for RUN/CMD/...)
    json: bool
    line: int


# --------------------------------------------------------------------------- Dockerfile parsing
def parse_dockerfile(path: Path) -> list[Instruction]:
    try:
        import dockerfile  # type: ignore[import-not-found]
    except ImportError:
        return _parse_fallback(path.read_text())
    return [Instruction(c.cmd.upper(), tuple(c.flags), tuple(c.value), bool(c.json), c.start_line)
            for c in dockerfile.parse_file(str(path))]


_SHELL_FORM = {"RUN", "CMD", "ENTRYPOINT", "SHELL"}


def _parse_fallback(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        cmd, _, rest = buf.strip().partition(" ")
        buf = ""
        cmd = cmd.upper()
        flags: list[str] = []
        rest = rest.strip()
        if cmd in ("COPY", "ADD", "FROM", "RUN", "HEALTHCHECK"):
            while rest.startswith("--"):
                flag, _, rest = rest.partition(" ")
                flags.append(flag)
                rest = rest.strip()
        is_json = False
        value: tuple[str, ...]
        if cmd == "HEALTHCHECK":
            kind, _, rest = rest.partition(" ")
            rest = rest.strip()
            if rest.startswith("["):
                value, is_json = (kind, *json.loads(rest)), True
            else:
                value = (kind, rest) if rest else (kind,)
        elif rest.startswith("[") and cmd in _SHELL_FORM | {"COPY", "ADD", "VOLUME"}:
            try:
                value, is_json = tuple(json.loads(rest)), True
            except json.JSONDecodeError:
                value = (rest,)
        elif cmd in _SHELL_FORM:
            value = (rest,)
        elif cmd in ("ENV", "LABEL"):   # flattened (key, value, key, value...) like the Go parser
            words = shlex.split(rest, posix=False)
            if words and "=" not in words[0]:
                value = (words[0], " ".join(words[1:]))
            else:
                value = tuple(x for w in words for x in w.split("=", 1))
        else:
            value = tuple(shlex.split(rest))
        out.append(Instruction(cmd, tuple(flags), value, is_json, start))
    return out


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """Instructions split at FROM; element 0 holds the global ARGs before the first FROM."""
    out: list[list[Instruction]] = [[]]
    for ins in instructions:
        if ins.cmd == "FROM":
            out.append([])
        out[-1].append(ins)
    return out


def arg_defaults(stage: list[Instruction]) -> dict[str, str]:
    out = {}
    for ins in stage:
        if ins.cmd == "ARG":
            for v in ins.value:
                name, _, default = v.partition("=")
                out[name] = default
    return out


def env_vars(stage: list[Instruction]) -> dict[str, str]:
    out: dict[str, str] = {}
    for ins in stage:
        if ins.cmd == "ENV":
            out.update(zip(ins.value[::2], ins.value[1::2]))
    return out


def expand(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), text)


def flag(ins: Instruction, name: str) -> str | None:
    for f in ins.flags:
        if f.startswith(f"--{name}="):
            return f.split("=", 1)[1]
    return None


def last(stage: list[Instruction], cmd: str) -> Instruction | None:
    found = [i for i in stage if i.cmd == cmd]
    return found[-1] if found else None


def context_sources(instructions: list[Instruction]) -> list[tuple[Instruction, str]]:
    """(instruction, source) for every COPY/ADD that reads the build context."""
    out = []
    for ins in instructions:
        if ins.cmd in ("COPY", "ADD") and flag(ins, "from") is None:
            out.extend((ins, src) for src in ins.value[:-1])
    return out


def copy_destinations(instructions: list[Instruction]) -> list[str]:
    return [ins.value[-1] for ins in instructions if ins.cmd in ("COPY", "ADD")]


# --------------------------------------------------------------------------- .dockerignore
@dataclasses.dataclass(frozen=True)
class IgnorePattern:
    text: str
    negate: bool
    regex: re.Pattern


def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if pattern.startswith("/", i):   # `**/` : zero or more directories
                    out += "(?:.*/)?"
                    i += 1
                else:
                    out += ".*"
                continue
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out += re.escape(c)
            else:
                body = pattern[i + 1:j]
                if body.startswith("^") or body.startswith("!"):
                    body = "^" + body[1:]
                out += f"[{body}]"
                i = j
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(f"^{out}$")


def parse_dockerignore(text: str) -> list[IgnorePattern]:
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:].strip()
        cleaned = posixpath.normpath(line).lstrip("/")
        if cleaned in ("", "."):
            continue
        out.append(IgnorePattern(raw.strip(), negate, _pattern_regex(cleaned)))
    return out


def load_dockerignore() -> list[IgnorePattern]:
    return parse_dockerignore(DOCKERIGNORE.read_text()) if DOCKERIGNORE.exists() else []


def is_excluded(path: str, patterns: list[IgnorePattern]) -> bool:
    """Whether `path` (relative to the context root) is left out of the build context."""
    path = posixpath.normpath(path).lstrip("/")
    parts = path.split("/")
    candidates = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    excluded = False
    for p in patterns:
        if any(p.regex.match(c) for c in candidates):
            excluded = not p.negate
    return excluded


# --------------------------------------------------------------------------- context files
def repo_files(under: str) -> list[str]:
    """Files git would ship under `under` (tracked + untracked-but-not-ignored), repo-relative."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", under],
                             cwd=REPO, capture_output=True, text=True, check=True, timeout=30).stdout
        files = [f for f in out.splitlines() if f and (REPO / f).is_file()]
        if files:
            return sorted(files)
    except (OSError, subprocess.SubprocessError):
        pass
    files = []
    for root, dirs, names in os.walk(REPO / under):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info")]
        files += [str(Path(root, n).relative_to(REPO)) for n in names if not n.endswith(".pyc")]
    return sorted(files)


def context_matches(source: str) -> list[Path]:
    """Context paths a COPY source names (wildcards expanded, as Docker does)."""
    if any(ch in source for ch in "*?["):
        return sorted(REPO.glob(source.lstrip("/")))
    return [REPO / source.lstrip("/")]
