"""A JSON schema to the regex the answer must match (structured/schema.py): what is enforced, what is refused
with the keyword named, and the compiler's quirks we correct."""
import datetime
import json
import re
from pathlib import Path

import jsonschema
import pytest

from dllm_server.decoding.params import StructuredOutputs
from dllm_server.structured.schema import MAX_SCHEMA_CHARS, ascii_shorthands, regex_for

SCHEMAS = Path(__file__).resolve().parents[2] / "bench" / "data" / "structured_schemas.json"


def rx(schema) -> re.Pattern:
    return re.compile(regex_for(StructuredOutputs(json=schema)))


def test_bounds_the_compiler_ignores_are_enforced():
    r = rx({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["age"]})
    assert r.fullmatch('{"age":120}') and r.fullmatch('{"age": 0}')
    assert not r.fullmatch('{"age":121}') and not r.fullmatch('{"age":-1}')
    p = rx({"type": "number", "minimum": 0, "maximum": 1})
    assert p.fullmatch("0.25") and p.fullmatch("1.0") and not p.fullmatch("1.5") and not p.fullmatch("-0.1")
    e = rx({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})
    assert [v for v in range(-3, 14) if e.fullmatch(str(v))] == list(range(1, 10))


@pytest.mark.parametrize("schema,named", [
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "number", "minimum": 0.5}, "minimum"),
    ({"type": "number", "exclusiveMinimum": 0}, "exclusiveMinimum"),
    ({"type": "string", "format": "ipv4"}, "format"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}, "oneOf"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
    ({"type": "string", "minimum": 3}, "numeric bounds"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "bounds"),
    ({"not": {"type": "null"}}, "not"),
])
def test_what_cannot_be_enforced_is_refused_naming_it(schema, named):
    with pytest.raises(ValueError, match=re.escape(named)) as e:
        regex_for(StructuredOutputs(json=schema))
    assert str(e.value).startswith("response_format")


def test_size_and_syntax_refusals():
    big = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(3000)}}
    with pytest.raises(ValueError, match=f"at most {MAX_SCHEMA_CHARS}"):
        regex_for(StructuredOutputs(json=big))
    with pytest.raises(ValueError, match="not valid JSON"):
        regex_for(StructuredOutputs(json="{not json", field="guided_json"))
    deep = {"type": "integer"}
    for _ in range(20):
        deep = {"type": "array", "items": deep}
    with pytest.raises(ValueError, match="nested"):
        regex_for(StructuredOutputs(json=deep))
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputs(json={}, regex="a")


def test_digits_mean_ascii_digits_as_in_json_schema():
    assert ascii_shorthands(r"\d[\d\w]\\d\.") == r"[0-9][0-9A-Za-z0-9_]\\d\."
    date = rx({"type": "string", "format": "date"})
    assert date.fullmatch('"2026-12-05"') and "\\d" not in date.pattern
    time_rx = regex_for(StructuredOutputs(json={"type": "string", "format": "time"}))
    assert re.fullmatch(time_rx, '"12:30:00.5Z"') and re.fullmatch(time_rx, '"23:59:59+05:30"')
    assert not re.fullmatch(time_rx, '"12:30:00"') and not re.fullmatch(time_rx, '"12:30:00\\x5Z"')


def test_date_regex_admits_exactly_the_calendar_dates():
    r = re.compile(regex_for(StructuredOutputs(json={"type": "string", "format": "date"})))
    for year in list(range(1896, 2105)) + [1600, 1700, 2400]:
        for month in range(0, 14):
            for day in range(0, 33):
                try:
                    datetime.date(year, month, day)
                    real = True
                except ValueError:
                    real = False
                assert bool(r.fullmatch(f'"{year:04d}-{month:02d}-{day:02d}"')) == real, (year, month, day)


def test_every_committed_benchmark_schema_compiles_and_its_regex_admits_only_valid_documents():
    items = json.load(open(SCHEMAS))
    assert len(items) >= 30
    samples = {"person": '{"name":"Ann","age":33}', "enum_color": '{"color":"blue"}', "bounded_int": "-50",
               "probability": "0.75", "nested": '{"user":{"id":7,"admin":false}}', "tuple": "[3,true]",
               "pattern_code": '{"code":"ABC-12"}', "ref_defs": '{"a":{"x":1,"y":2},"b":{"x":0,"y":9}}'}
    for it in items:
        spec = StructuredOutputs(json=it["schema"]) if it["schema"] is not None else StructuredOutputs(json_object=True)
        r = re.compile(regex_for(spec))
        if it["name"] in samples:
            assert r.fullmatch(samples[it["name"]]), it["name"]
            jsonschema.validate(json.loads(samples[it["name"]]), it["schema"])


def test_json_object_admits_objects_two_levels_deep():
    from dllm_server.structured.schema import JSON_OBJECT
    r = re.compile(regex_for(StructuredOutputs(json_object=True)))
    assert r.pattern == JSON_OBJECT
    for doc in ['{}', '{"a": [1, 2.5e3], "b": {"c": null}}', '{"q":"say \\"hi\\""}', '{"t":true,"f":false}']:
        assert r.fullmatch(doc) and isinstance(json.loads(doc), dict), doc
    for doc in ['[1]', '{"a":}', '{"a":1,}', '{a:1}', '"x"', '{"a":{"b":{"c":1}}}']:
        assert not r.fullmatch(doc), doc
