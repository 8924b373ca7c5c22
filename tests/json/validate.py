#!/usr/bin/env python3
"""A small JSON Schema validator (the subset docs/cli-json.schema.json uses), with no
third-party packages, for CI: validate.py SCHEMA [FILE ...] (stdin without FILEs).

Keywords: type (one or a list), const, enum, properties, required,
additionalProperties (false or a schema), items, minItems, maxItems, minimum,
maximum, oneOf, anyOf, $ref ("#/$defs/NAME"). Annotations ($schema, $id, title,
description) are ignored; any other keyword is an error in the schema, so the
schema cannot quietly ask for something this does not check.
Exit 0 when every document validates, 1 with the paths that do not.
"""
import json
import sys

ANNOTATIONS = {"$schema", "$id", "title", "description", "$defs"}
KEYWORDS = {"type", "const", "enum", "properties", "required", "additionalProperties", "items", "minItems",
            "maxItems", "minimum", "maximum", "oneOf", "anyOf", "$ref"}
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


class Validator:
    def __init__(self, root):
        self.root = root
        self.check_schema(root, "#")

    def check_schema(self, schema, where):
        if not isinstance(schema, dict):
            raise ValueError(f"schema at {where} is not an object")
        for key, value in schema.items():
            if key not in KEYWORDS | ANNOTATIONS:
                raise ValueError(f"schema at {where} uses \"{key}\", which this validator does not check")
            if key == "$defs":
                for name, sub in value.items():
                    self.check_schema(sub, f"{where}/$defs/{name}")
            elif key == "properties":
                for name, sub in value.items():
                    self.check_schema(sub, f"{where}/properties/{name}")
            elif key in ("items",) or (key == "additionalProperties" and isinstance(value, dict)):
                self.check_schema(value, f"{where}/{key}")
            elif key in ("oneOf", "anyOf"):
                for i, sub in enumerate(value):
                    self.check_schema(sub, f"{where}/{key}/{i}")
            elif key == "$ref":
                self.resolve(value)

    def resolve(self, ref):
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"only local references are supported, got {ref}")
        name = ref[len("#/$defs/"):]
        if name not in self.root.get("$defs", {}):
            raise ValueError(f"{ref} names no definition")
        return self.root["$defs"][name]

    def errors(self, value, schema, path):
        """Every reason `value` does not match `schema`, as "path: reason"."""
        out = []
        if "$ref" in schema:
            out += self.errors(value, self.resolve(schema["$ref"]), path)
        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(TYPES[t](value) for t in types):
                return out + [f"{path}: expected {' or '.join(types)}, got {json.dumps(value)[:80]}"]
        if "const" in schema and value != schema["const"]:
            out.append(f"{path}: expected {json.dumps(schema['const'])}, got {json.dumps(value)[:80]}")
        if "enum" in schema and value not in schema["enum"]:
            out.append(f"{path}: {json.dumps(value)[:80]} is not one of {json.dumps(schema['enum'])}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                out.append(f"{path}: {value} is below {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                out.append(f"{path}: {value} is above {schema['maximum']}")
        if isinstance(value, dict):
            props = schema.get("properties", {})
            for name in schema.get("required", []):
                if name not in value:
                    out.append(f"{path}: \"{name}\" is required")
            for name, sub in value.items():
                if name in props:
                    out += self.errors(sub, props[name], f"{path}.{name}")
                elif schema.get("additionalProperties") is False:
                    out.append(f"{path}: \"{name}\" is not in the schema")
                elif isinstance(schema.get("additionalProperties"), dict):
                    out += self.errors(sub, schema["additionalProperties"], f"{path}.{name}")
        if isinstance(value, list):
            if "minItems" in schema and len(value) < schema["minItems"]:
                out.append(f"{path}: {len(value)} items, at least {schema['minItems']} expected")
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                out.append(f"{path}: {len(value)} items, at most {schema['maxItems']} expected")
            if "items" in schema:
                for i, item in enumerate(value):
                    out += self.errors(item, schema["items"], f"{path}[{i}]")
        for key in ("oneOf", "anyOf"):
            if key not in schema:
                continue
            results = [self.errors(value, sub, path) for sub in schema[key]]
            matches = sum(1 for r in results if not r)
            if key == "oneOf" and matches != 1 or key == "anyOf" and matches == 0:
                if matches > 1:
                    out.append(f"{path}: matches {matches} of the oneOf alternatives")
                else:
                    # The alternative that came closest says why.
                    out += min(results, key=len) if results else [f"{path}: empty {key}"]
        return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        validator = Validator(json.load(f))
    sources = [(name, open(name).read()) for name in sys.argv[2:]] or [("<stdin>", sys.stdin.read())]
    failed = False
    for name, text in sources:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            print(f"{name}: not JSON: {e}")
            failed = True
            continue
        errs = validator.errors(doc, validator.root, "$")
        for e in errs[:20]:
            print(f"{name}: {e}")
        failed |= bool(errs)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
