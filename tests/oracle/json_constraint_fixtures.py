#!/usr/bin/env python3
"""Writes tests/fixtures/json_constraint/cases.json: (schema, document, expectation) triples for
tests/text_json_constraint_test.cc.

    python3 tests/oracle/json_constraint_fixtures.py [OUT]

Every document is labelled independently of the C++ code:
  * "accept": generated from the schema by construction, serialized by Python's json module in
    a spelling inside the constraint's policy (compact, json.dumps' default ", " / ": ", or
    indent=2 where the indent stays within 20 columns; keys in the schema's order), and checked
    valid by the jsonschema package (Draft 2020-12);
  * "reject" with reason "invalid": a mutation (wrong type, missing or extra property, array too
    short or long, value outside the enum, truncation, malformed JSON) that json.loads refuses or
    jsonschema finds invalid;
  * "reject" with reason "policy: ...": valid to jsonschema but outside the constraint's spelling
    policy (key order, whitespace, 1.0 as an integer, an escaped enum value, digit limits).
json_object mode gets json.dumps of random objects ("accept") and non-objects ("reject").

Needs the jsonschema package (present in the development image; not in tests/oracle/
requirements.txt because nothing else needs it). Deterministic: a fixed seed.
"""
import json
import os
import random
import sys

import jsonschema

SEED = 20240611
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(ROOT, "tests", "fixtures", "json_constraint", "cases.json")

ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string"},
        "city": {"type": "string"},
        "zip": {"type": ["string", "null"]},
    },
    "required": ["street", "city", "zip"],
    "additionalProperties": False,
}

SCHEMAS = [
    ("strict_person", {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "full name"},
            "age": {"type": "integer"},
            "email": {"type": ["string", "null"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "active": {"type": "boolean"},
            "score": {"type": "number"},
        },
        "required": ["name", "age", "email", "tags", "active", "score"],
        "additionalProperties": False,
    }),
    ("defs_and_nullable_ref", {
        "$defs": {"address": ADDRESS},
        "type": "object",
        "properties": {
            "home": {"$ref": "#/$defs/address"},
            "work": {"anyOf": [{"$ref": "#/$defs/address"}, {"type": "null"}]},
        },
        "required": ["home", "work"],
        "additionalProperties": False,
    }),
    ("definitions_ref", {
        "definitions": {"point": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"],
            "additionalProperties": False,
        }},
        "type": "array",
        "items": {"$ref": "#/definitions/point"},
        "maxItems": 4,
    }),
    ("enum_and_const", {
        "type": "object",
        "properties": {
            "kind": {"const": "circle"},
            "color": {"type": "string", "enum": ["red", "green", "blue", "grün"]},
            "radius": {"type": "number"},
        },
        "required": ["kind", "color", "radius"],
        "additionalProperties": False,
    }),
    ("discriminated_union", {
        "anyOf": [
            {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
             "required": ["kind", "x"], "additionalProperties": False},
            {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
             "required": ["kind", "y"], "additionalProperties": False},
            {"type": "object", "properties": {"kind": {"const": "ab"}, "x": {"type": "string"}},
             "required": ["kind", "x"], "additionalProperties": False},
        ],
    }),
    ("array_bounds", {"type": "array", "items": {"type": "integer"}, "minItems": 1,
                      "maxItems": 3}),
    ("optional_properties", {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": "integer"},
            "c": {"type": "boolean"},
            "d": {"type": "null"},
        },
        "required": ["a", "c"],
        "additionalProperties": False,
    }),
    ("recursive_tree", {
        "$defs": {"node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["value", "children"],
            "additionalProperties": False,
        }},
        "$ref": "#/$defs/node",
    }),
    ("number_root", {"type": "number"}),
    ("integer_root", {"type": "integer"}),
    ("type_list", {"type": ["string", "number", "null"]}),
    ("map_of_integers", {"type": "object", "additionalProperties": {"type": "integer"}}),
    ("string_root", {"type": "string"}),
    ("nested_arrays", {"type": "array",
                       "items": {"type": "array", "items": {"type": "boolean"}}}),
    ("mixed_enum", {"enum": [1, 12, "x", None, True, {"a": [1, 2]}]}),
    ("any_value", {}),
    ("empty_closed_object", {"type": "object", "properties": {},
                             "additionalProperties": False}),
    ("integer_or_number", {"anyOf": [{"type": "integer"}, {"type": "number"}]}),
]

STRING_ALPHABET = (["a", "b", "Z", " ", "0", "-", "_", "é", "ß", "中", "文", "😀", "\"", "\\",
                    "/", "\n", "\t", "\u0001", "\u007f", "€"])


def random_string(rng):
    return "".join(rng.choice(STRING_ALPHABET) for _ in range(rng.randint(0, 8)))


def random_number(rng):
    choice = rng.random()
    if choice < 0.4:
        return rng.randint(-10**12, 10**12)
    if choice < 0.6:
        return rng.randint(-9, 9)
    if choice < 0.8:
        return round(rng.uniform(-1000, 1000), rng.randint(0, 6))
    return rng.choice([1e-7, 2.5e20, -3.25e-12, 0.0, -0.5, 1e100])


def resolve(schema, root):
    while "$ref" in schema:
        ref = schema["$ref"]
        node = root
        for token in ref[2:].split("/") if ref != "#" else []:
            node = node[token.replace("~1", "/").replace("~0", "~")]
        schema = node
    return schema


def random_any(rng, depth):
    kinds = ["string", "number", "boolean", "null"]
    if depth < 4:
        kinds += ["object", "array"]
    kind = rng.choice(kinds)
    if kind == "object":
        return {random_string(rng): random_any(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if kind == "array":
        return [random_any(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "string":
        return random_string(rng)
    if kind == "number":
        return random_number(rng)
    if kind == "boolean":
        return rng.random() < 0.5
    return None


def instance(rng, schema, root, depth=0):
    """A random valid instance of `schema` (the fixture's subset), keys in schema order."""
    schema = resolve(schema, root)
    if "anyOf" in schema:
        return instance(rng, rng.choice(schema["anyOf"]), root, depth)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    types = schema.get("type")
    if types is None:
        return random_any(rng, depth)
    if isinstance(types, list):
        types = rng.choice(types)
    if types == "object":
        if "properties" in schema:
            required = set(schema.get("required", []))
            return {name: instance(rng, sub, root, depth + 1)
                    for name, sub in schema["properties"].items()
                    if name in required or rng.random() < 0.5}
        values = schema.get("additionalProperties", {})
        return {random_string(rng): instance(rng, values, root, depth + 1)
                for _ in range(rng.randint(0, 3))}
    if types == "array":
        low = schema.get("minItems", 0)
        high = schema.get("maxItems", 4)
        if depth > 4:
            high = low
        return [instance(rng, schema.get("items", {}), root, depth + 1)
                for _ in range(rng.randint(low, high))]
    if types == "string":
        return random_string(rng)
    if types == "number":
        return random_number(rng)
    if types == "integer":
        return rng.randint(-10**12, 10**12)
    if types == "boolean":
        return rng.random() < 0.5
    return None


def nesting(value):
    if isinstance(value, dict):
        return 1 + max([nesting(v) for v in value.values()], default=0)
    if isinstance(value, list):
        return 1 + max([nesting(v) for v in value], default=0)
    return 0


# Schemas whose enum holds objects or arrays: those values are accepted only compact.
COMPACT_ONLY = {"mixed_enum"}


def spellings(value, compact_only=False):
    out = [json.dumps(value, ensure_ascii=False, separators=(",", ":"))]
    if compact_only:
        return out
    out.append(json.dumps(value, ensure_ascii=False))
    if nesting(value) <= 10:
        out.append(json.dumps(value, ensure_ascii=False, indent=2))
    return out


def is_valid(schema, text):
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def mutations(rng, schema, value):
    """Values and texts that should be invalid; the caller keeps only the truly invalid ones."""
    texts = []
    compact = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    # Truncations.
    for _ in range(3):
        if len(compact) > 1:
            texts.append(compact[:rng.randint(1, len(compact) - 1)])
    # Malformed JSON.
    texts += [compact + ",", "{" + compact, compact.replace(":", "=", 1), "'" + compact + "'"]
    if compact.endswith("}") and len(compact) > 2:
        texts.append(compact[:-1] + ",}")
    if compact.endswith("]") and len(compact) > 2:
        texts.append(compact[:-1] + ",]")
    # Wrong-typed or out-of-schema values.
    if isinstance(value, dict):
        for key in list(value):
            broken = dict(value)
            del broken[key]
            texts.append(json.dumps(broken, ensure_ascii=False))
            for replacement in ["oops", 1.5, None, [], {}, True]:
                broken = dict(value)
                broken[key] = replacement
                texts.append(json.dumps(broken, ensure_ascii=False))
        extra = dict(value)
        extra["unexpected"] = 1
        texts.append(json.dumps(extra, ensure_ascii=False))
    if isinstance(value, list):
        texts.append(json.dumps([], ensure_ascii=False))
        texts.append(json.dumps(value + value + value + value, ensure_ascii=False))
        texts.append(json.dumps(value + ["x"], ensure_ascii=False))
    for other in ["s", 0, 1.5, None, True, [], {}, {"kind": "c"}, "purple"]:
        texts.append(json.dumps(other))
    return texts


POLICY_CASES = {
    # name: [(text, reason)] valid to jsonschema, outside the spelling policy.
    "strict_person": [
        ('{"age":1,"name":"x","email":null,"tags":[],"active":true,"score":1}',
         "policy: keys out of schema order"),
        ('{"name":"x","age":1.0,"email":null,"tags":[],"active":true,"score":1}',
         "policy: an integer written as 1.0"),
        ('{"name":"x","age":1e2,"email":null,"tags":[],"active":true,"score":1}',
         "policy: an integer written with an exponent"),
        (' {"name":"x","age":1,"email":null,"tags":[],"active":true,"score":1}',
         "policy: whitespace before the document"),
        ('{"name":"x","age":1,"email":null,"tags":[],"active":true,"score":1}\n',
         "policy: whitespace after the document"),
        ('{"name":"x",  "age":1,"email":null,"tags":[],"active":true,"score":1}',
         "policy: two spaces in a gap"),
        ('{"name":"x",\r\n"age":1,"email":null,"tags":[],"active":true,"score":1}',
         "policy: carriage return in a gap"),
        ('{"name":"x",\n' + " " * 21 + '"age":1,"email":null,"tags":[],"active":true,"score":1}',
         "policy: 21 columns of indent"),
        ('{"name":"x",\n\n\n"age":1,"email":null,"tags":[],"active":true,"score":1}',
         "policy: three newlines in a gap"),
        ('{"name":"x","age":123456789012345678901,"email":null,"tags":[],"active":true,'
         '"score":1}', "policy: 21 integer digits"),
        ('{"name":"x","age":1,"email":null,"tags":[],"active":true,"score":1e1000}',
         "policy: 4 exponent digits"),
        ('{"\\u006eame":"x","age":1,"email":null,"tags":[],"active":true,"score":1}',
         "policy: an escaped property name"),
    ],
    "enum_and_const": [
        ('{"kind":"circle","color":"\\u0072ed","radius":1}',
         "policy: an enum value spelled with an escape"),
        ('{"kind":"circle","color":"gr\\u00fcn","radius":1}',
         "policy: an enum value spelled with an escape"),
    ],
    "mixed_enum": [
        ('{"a": [1, 2]}', "policy: whitespace inside an enum value"),
        ("1.0", "policy: an enum number spelled differently"),
    ],
    "optional_properties": [
        ('{"c":true,"a":"x"}', "policy: keys out of schema order"),
    ],
}

# Valid by construction and within policy, written by hand for edge cases.
EXTRA_ACCEPTS = {
    "strict_person": [
        '{"name":"\\ud83d\\ude00 \\u00e9\\n\\"\\\\\\/\\b\\f\\r\\t","age":-0,"email":"",'
        '"tags":[],"active":false,"score":-0.0e-0}',
        '{\n\n\t\t"name" :\n\t"x" ,\n  "age": 0, "email":null,"tags":[ "a" , "b" ],'
        '"active":true,"score":12345678901234567890.12345678901234567890E+123}',
    ],
    "mixed_enum": ["1", "12", '"x"', "null", "true", '{"a":[1,2]}'],
    "integer_or_number": ["1", "1.5", "-0", "2e3"],
    "empty_closed_object": ["{}", "{ }", "{\n}"],
    "any_value": ["[]", "{}", '""', "0", "false", '[{"a":[{"b":null}]}]'],
}


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT
    rng = random.Random(SEED)
    cases = []
    for name, schema in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema)
        documents = []
        seen = set()

        def add(text, expect, reason):
            if text in seen:
                return
            seen.add(text)
            documents.append({"text": text, "expect": expect, "reason": reason})

        values = [instance(rng, schema, schema) for _ in range(12)]
        for value in values:
            for text in spellings(value, name in COMPACT_ONLY):
                assert is_valid(schema, text), (name, text)
                add(text, "accept", "valid")
        for text in EXTRA_ACCEPTS.get(name, []):
            assert is_valid(schema, text), (name, text)
            add(text, "accept", "valid")
        for value in values[:6]:
            for text in mutations(rng, schema, value):
                if not is_valid(schema, text):
                    add(text, "reject", "invalid")
        for text, reason in POLICY_CASES.get(name, []):
            assert is_valid(schema, text), (name, text)
            add(text, "reject", reason)
        cases.append({"name": name, "schema": schema, "documents": documents})

    json_object = []
    for _ in range(40):
        value = {random_string(rng): random_any(rng, 1) for _ in range(rng.randint(0, 4))}
        for text in spellings(value):
            json_object.append({"text": text, "expect": "accept", "reason": "an object"})
    for text in ["[]", '"s"', "1", "null", "true", "{", '{"a"}', '{"a":}', '{"a":1,}', "{}}",
                 '{"a":01}', '{"a":.5}', '{"a":+1}', '{"a":NaN}', '{"a":"\\x"}', "{'a':1}",
                 '{"a":"\u0001"}', '{"a":[1,]}', '{"a" 1}', '{1:2}']:
        json_object.append({"text": text, "expect": "reject", "reason": "not a JSON object"})

    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/oracle/json_constraint_fixtures.py", "seed": SEED,
                   "cases": cases, "json_object": json_object}, f, ensure_ascii=True, indent=1)
        f.write("\n")
    total = sum(len(c["documents"]) for c in cases) + len(json_object)
    print(f"wrote {out_path}: {len(cases)} schemas, {total} documents")


if __name__ == "__main__":
    main()
