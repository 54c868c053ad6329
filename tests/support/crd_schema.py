"""The ModelServer CRD's schema, applied the way the API server applies it: defaults, OpenAPI v3
validation (jsonschema, strict field validation as kubectl asks for), list-map keys, and the CEL
x-kubernetes-validations rules evaluated with cel-python."""
from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "charts" / "spillway" / "crds" / "modelservers.spillway.dev.yaml"


def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def version_schema(doc: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = doc or crd()
    version, = doc["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def _strict(schema: Any) -> Any:
    """OpenAPI -> JSON Schema: objects with declared properties reject unknown fields (kubectl's
    --validate=strict), unless x-kubernetes-preserve-unknown-fields says otherwise."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if (schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def spec_schema() -> dict[str, Any]:
    """The ModelServer's spec as strict JSON Schema (a generator's input), `model` not required."""
    schema = copy.deepcopy(_strict(version_schema())["properties"]["spec"])
    schema.pop("required", None)
    return schema


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: a missing property with a default gets it, recursively."""
    if isinstance(value, dict) and schema.get("type") == "object":
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in value:
                if name not in (schema.get("properties") or {}):
                    value[name] = apply_defaults(extra, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def _nodes(schema: dict[str, Any], value: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any], Any]]:
    yield path, schema, value
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                yield from _nodes(sub, value[name], f"{path}.{name}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _nodes(schema["items"], item, f"{path}[{i}]")


_CEL = celpy.Environment()


def cel_errors(schema: dict[str, Any], obj: Any) -> list[str]:
    errors = []
    for path, node, value in _nodes(schema, obj):
        for rule in node.get("x-kubernetes-validations") or []:
            program = _CEL.program(_CEL.compile(rule["rule"]))
            result = program.evaluate({"self": celpy.json_to_cel(value)})
            if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
                errors.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])}")
    return errors


def list_map_errors(schema: dict[str, Any], obj: Any) -> list[str]:
    errors = []
    for path, node, value in _nodes(schema, obj):
        if node.get("x-kubernetes-list-type") == "map" and isinstance(value, list):
            keys = [tuple(item.get(k) for k in node["x-kubernetes-list-map-keys"]) for item in value]
            if len(keys) != len(set(keys)):
                errors.append(f"{path}: duplicate entries for keys {node['x-kubernetes-list-map-keys']}")
    return errors


def admit(obj: dict[str, Any], schema: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the defaulted object, the API server's errors: schema, list-map keys, then CEL)."""
    schema = schema or version_schema()
    obj = apply_defaults(schema, copy.deepcopy(obj))
    validator = jsonschema.Draft7Validator(_strict(schema))
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]
    if errors:
        return obj, errors
    errors = list_map_errors(schema, obj)
    return obj, errors or cel_errors(schema, obj)


def rules(schema: dict[str, Any] | None = None) -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            found.extend(r["rule"] for r in node.get("x-kubernetes-validations") or [])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(schema or version_schema())
    return found
