"""The regular expression of what a request asks the answer to be (decoding/params.py StructuredOutputs): a JSON
schema is checked against what we can enforce exactly, then compiled by outlines-core, with the numeric bounds
that compiler ignores written in by us. Every refusal is a ValueError naming the field and the reason."""
from __future__ import annotations

import json
import math

from ..decoding.params import StructuredOutputs
from .numbers import integer_regex, number_regex

MAX_SCHEMA_CHARS = 32_768           # a schema's JSON text
MAX_REGEX_CHARS = 65_536            # the compiled expression (a bound on the automaton's work)
MAX_DEPTH = 16                      # nesting of a schema's objects, arrays and alternatives

# Keywords whose meaning the compiled regex enforces exactly (annotations change nothing).
_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                "readOnly", "writeOnly", "strict"}
_KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
             "maxItems", "enum", "const", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
             "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions"}
_FORMATS = {"date", "time", "date-time", "uuid", "email", "uri"}
_PLACEHOLDER = "zqdllmnum{}zq"      # a string constant the compiler copies verbatim, replaced afterwards
# RFC 3339 as JSON Schema's formats mean them (outlines-core 0.2.14 allows 11-31 and 02-30, makes the offset
# optional and escapes the time fraction's dot twice): written here, the leap day for leap years only.
_LEAP = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
_DATE = (r"([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
         r"02-(0[1-9]|1[0-9]|2[0-8]))|" + _LEAP + "-02-29)")
_TIME = r"(2[0-3]|[01][0-9]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-](2[0-3]|[01][0-9]):[0-5][0-9])"
_OWN_FORMATS = {"date": _DATE, "time": _TIME, "date-time": _DATE + "T" + _TIME}


def _json_object() -> str:
    """Any JSON object whose values are scalars, or arrays / objects of scalars: two levels index far faster than
    the compiler's generic object (docs/structured_output.md has the figures); deeper needs a schema."""
    w = r"[ ]?"
    string = r'"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*"'
    number = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
    scalar = f"({string}|{number}|true|false|null)"

    def array(x):
        return rf"\[{w}({x}({w},{w}{x})*)?{w}\]"

    def obj(x):
        return rf"\{{{w}({string}{w}:{w}{x}({w},{w}{string}{w}:{w}{x})*)?{w}\}}"
    return obj(f"({scalar}|{array(scalar)}|{obj(scalar)})")


JSON_OBJECT = _json_object()


def regex_for(spec: StructuredOutputs) -> str:
    """The regular expression whose matches are exactly the answers `spec` allows (ValueError: refused)."""
    f = spec.field
    if spec.regex is not None:
        if not isinstance(spec.regex, str) or not spec.regex:
            raise ValueError(f"{f}: the regex must be a non-empty string")
        if len(spec.regex) > MAX_REGEX_CHARS:
            raise ValueError(f"{f}: the regex has {len(spec.regex)} characters; at most {MAX_REGEX_CHARS}")
        return spec.regex
    if spec.json_object:
        return JSON_OBJECT
    schema = spec.json
    if isinstance(schema, str):
        if len(schema) > MAX_SCHEMA_CHARS:
            raise ValueError(f"{f}: the schema has {len(schema)} characters; at most {MAX_SCHEMA_CHARS}")
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"{f}: the schema is not valid JSON ({e})") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"{f}: the schema must be a JSON object")
    text = json.dumps(schema)
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValueError(f"{f}: the schema has {len(text)} characters; at most {MAX_SCHEMA_CHARS}")
    bounds: list[str] = []
    rewritten = _rewrite(schema, f, bounds, 0)
    from outlines_core.json_schema import build_regex_from_schema
    try:
        rx = build_regex_from_schema(json.dumps(rewritten))
    except Exception as e:          # the compiler's own refusal, in its words
        raise ValueError(f"{f}: the schema cannot be compiled: {e}") from None
    for i, sub in enumerate(bounds):
        rx = rx.replace('"' + _PLACEHOLDER.format(i) + '"', "(" + sub + ")")
    rx = ascii_shorthands(rx)
    if len(rx) > MAX_REGEX_CHARS:
        raise ValueError(f"{f}: the schema compiles to {len(rx)} regex characters; at most {MAX_REGEX_CHARS}")
    return rx


_SHORTHANDS = {"d": "0-9", "w": "A-Za-z0-9_"}


def ascii_shorthands(rx: str) -> str:
    """\\d and \\w as JSON Schema means them (ECMA-262: ASCII), not as the compiler's Unicode-aware engine
    does (where \\d also matches, say, Balinese digits, which no date parser accepts)."""
    out, i, in_class = [], 0, False
    while i < len(rx):
        c = rx[i]
        if c == "\\" and i + 1 < len(rx):
            nxt = rx[i + 1]
            if nxt in _SHORTHANDS:
                out.append(_SHORTHANDS[nxt] if in_class else "[" + _SHORTHANDS[nxt] + "]")
            else:
                out.append(rx[i:i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def _whole(v, where: str, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        raise ValueError(f"{where}.{key}: only whole-number bounds are enforced, got {v!r}")
    return int(v)


def _numeric(node: dict, where: str, bounds: list[str]) -> dict:
    """An integer or number node with bounds becomes a placeholder for our own range regex (`bounds`: the
    regexes placeholders stand for, quotes included where the value is a string)."""
    kind = node.get("type")
    keys = [k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in node]
    if not keys:
        return node
    lo = _whole(node["minimum"], where, "minimum") if "minimum" in node else None
    hi = _whole(node["maximum"], where, "maximum") if "maximum" in node else None
    for k in ("exclusiveMinimum", "exclusiveMaximum"):
        if k in node:
            if kind != "integer":
                raise ValueError(f"{where}.{k}: exclusive bounds are enforced on integers only")
            v = _whole(node[k], where, k)
            lo, hi = (max(lo, v + 1) if lo is not None else v + 1, hi) if k == "exclusiveMinimum" else \
                (lo, min(hi, v - 1) if hi is not None else v - 1)
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{where}: no {kind} lies within its bounds ({lo} > {hi})")
    bounds.append(integer_regex(lo, hi) if kind == "integer" else number_regex(lo, hi))
    extra = {k: v for k, v in node.items() if k in _ANNOTATIONS}
    return {**extra, "const": _PLACEHOLDER.format(len(bounds) - 1)}


def _rewrite(node, where: str, bounds: list[str], depth: int):
    """A copy of the schema in which what we cannot enforce is refused and numeric bounds are ours."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{where}: nested more than {MAX_DEPTH} levels")
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        raise ValueError(f"{where}: a schema must be an object, got {type(node).__name__}")
    for k in node:
        if k not in _KEYWORDS and k not in _ANNOTATIONS:
            raise ValueError(f"{where}.{k}: not supported in structured output (the answer could not be "
                             "guaranteed to satisfy it)")
    if "format" in node and node["format"] not in _FORMATS:
        raise ValueError(f"{where}.format: {node['format']!r} is not supported (supported: {sorted(_FORMATS)})")
    if "oneOf" in node:
        types = [alt.get("type") if isinstance(alt, dict) else None for alt in node["oneOf"]]
        if None in types or any(not isinstance(t, str) for t in types) or len(set(types)) != len(types) \
                or {"integer", "number"} <= set(types):
            raise ValueError(f"{where}.oneOf: enforced only when each alternative has its own distinct type "
                             "(else two could match); use anyOf")
    if node.get("type") in ("integer", "number"):
        node = _numeric(node, where, bounds)
    elif node.get("format") in _OWN_FORMATS and node.get("type", "string") == "string":
        bounds.append('"' + _OWN_FORMATS[node["format"]] + '"')
        node = {"const": _PLACEHOLDER.format(len(bounds) - 1)}
    elif any(k in node for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        raise ValueError(f"{where}: numeric bounds are enforced where type is \"integer\" or \"number\"")
    out = {}
    for k, v in node.items():
        if k in ("properties", "$defs", "definitions"):
            if not isinstance(v, dict):
                raise ValueError(f"{where}.{k}: must be an object")
            out[k] = {name: _rewrite(sub, f"{where}.{k}.{name}", bounds, depth + 1) for name, sub in v.items()}
        elif k in ("items", "additionalProperties") and isinstance(v, dict):
            out[k] = _rewrite(v, f"{where}.{k}", bounds, depth + 1)
        elif k in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if not isinstance(v, list) or not v:
                raise ValueError(f"{where}.{k}: must be a non-empty list")
            out[k] = [_rewrite(sub, f"{where}.{k}[{i}]", bounds, depth + 1) for i, sub in enumerate(v)]
        else:
            out[k] = v
    return out
