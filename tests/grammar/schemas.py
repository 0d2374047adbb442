"""Varied JSON schemas for the structured-output tests: nested objects, arrays, enums,
bounded numbers, required/optional properties, string patterns and formats. Strings and
arrays are bounded so a small model finishes within the token budget."""

from __future__ import annotations

NAME = {"type": "string", "minLength": 1, "maxLength": 16}

SCHEMAS: dict[str, dict] = {
    "person": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    },
    "optional_email": {
        "type": "object",
        "properties": {"name": NAME, "email": {"type": "string", "maxLength": 24}},
        "required": ["name"],
    },
    "enum_color": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
    "bounded_float": {
        "type": "object",
        "properties": {"temperature_celsius": {"type": "number", "minimum": -50,
                                               "maximum": 60}},
        "required": ["temperature_celsius"],
    },
    "exclusive_bounds": {
        "type": "object",
        "properties": {"score": {"type": "integer", "exclusiveMinimum": 0,
                                 "exclusiveMaximum": 10}},
        "required": ["score"],
    },
    "boolean_flags": {
        "type": "object",
        "properties": {"is_open": {"type": "boolean"}, "has_parking": {"type": "boolean"}},
        "required": ["is_open", "has_parking"],
    },
    "string_array": {
        "type": "object",
        "properties": {"fruits": {"type": "array", "items": NAME, "minItems": 1,
                                  "maxItems": 3}},
        "required": ["fruits"],
    },
    "integer_array": {
        "type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 99},
        "minItems": 2, "maxItems": 5,
    },
    "nested_address": {
        "type": "object",
        "properties": {
            "name": NAME,
            "address": {
                "type": "object",
                "properties": {"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
            },
        },
        "required": ["name", "address"],
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array", "minItems": 1, "maxItems": 3,
                "items": {"type": "object",
                          "properties": {"sku": NAME,
                                         "qty": {"type": "integer", "minimum": 1,
                                                 "maximum": 9}},
                          "required": ["sku", "qty"]},
            }
        },
        "required": ["items"],
    },
    "pattern_date": {
        "type": "object",
        "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}},
        "required": ["date"],
    },
    "pattern_code": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
        "required": ["code"],
    },
    "const_version": {
        "type": "object",
        "properties": {"version": {"const": "1.0"}, "name": NAME},
        "required": ["version", "name"],
    },
    "enum_integers": {
        "type": "object",
        "properties": {"stars": {"enum": [1, 2, 3, 4, 5]}, "review": NAME},
        "required": ["stars", "review"],
    },
    "nullable": {
        "type": "object",
        "properties": {"nickname": {"anyOf": [NAME, {"type": "null"}]}},
        "required": ["nickname"],
    },
    "one_of_shapes": {
        "type": "object",
        "properties": {
            "shape": {"anyOf": [
                {"type": "object", "properties": {"radius": {"type": "number", "minimum": 0,
                                                             "maximum": 100}},
                 "required": ["radius"]},
                {"type": "object", "properties": {"side": {"type": "integer", "minimum": 1,
                                                           "maximum": 100}},
                 "required": ["side"]},
            ]}
        },
        "required": ["shape"],
    },
    "deep_nesting": {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {
            "type": "object", "properties": {"c": {"type": "integer", "minimum": 0,
                                                   "maximum": 9}},
            "required": ["c"]}}, "required": ["b"]}},
        "required": ["a"],
    },
    "tuple_like": {
        "type": "object",
        "properties": {"point": {"type": "array", "prefixItems": [
            {"type": "integer", "minimum": -9, "maximum": 9},
            {"type": "integer", "minimum": -9, "maximum": 9}], "items": False}},
        "required": ["point"],
    },
    "defs_ref": {
        "$defs": {"pet": {"type": "object", "properties": {
            "species": {"enum": ["cat", "dog"]}, "name": NAME}, "required": ["species", "name"]}},
        "type": "object",
        "properties": {"pets": {"type": "array", "items": {"$ref": "#/$defs/pet"},
                                "minItems": 1, "maxItems": 2}},
        "required": ["pets"],
    },
    "mixed_types": {
        "type": "object",
        "properties": {
            "title": NAME, "pages": {"type": "integer", "minimum": 1, "maximum": 2000},
            "price": {"type": "number", "minimum": 0, "maximum": 500},
            "in_stock": {"type": "boolean"},
            "genre": {"enum": ["fiction", "science", "history"]},
        },
        "required": ["title", "pages", "price", "in_stock", "genre"],
    },
    "array_enum_unique": {
        "type": "object",
        "properties": {"days": {"type": "array", "items": {"enum": ["mon", "tue", "wed"]},
                                "minItems": 1, "maxItems": 3}},
        "required": ["days"],
    },
    "string_length": {
        "type": "object",
        # xgrammar 0.2.9 ignores min/maxLength next to a pattern (it warns): put the
        # length in the pattern (docs/structured_output.md)
        "properties": {"initials": {"type": "string", "pattern": "^[A-Z]{2,3}$"}},
        "required": ["initials"],
    },
}

PROMPTS: dict[str, str] = {k: f"Reply with a JSON value for a '{k.replace('_', ' ')}'."
                           for k in SCHEMAS}
