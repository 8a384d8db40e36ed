"""Checks JSON answers against TGI's published OpenAPI schemas (the subset those schemas use).

`data/tgi-openapi.json` is TGI's own OpenAPI document, copied unchanged.
"""

from __future__ import annotations

import json
import os
from typing import Any

OPENAPI_PATH = os.path.join(os.path.dirname(__file__), "data", "tgi-openapi.json")
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def load_schemas() -> dict[str, Any]:
    with open(OPENAPI_PATH) as f:
        return json.load(f)["components"]["schemas"]


def validate(instance: Any, schema_name: str, schemas: dict[str, Any]) -> None:
    """Raises AssertionError naming the path of the first value the schema rejects."""
    _check(instance, schemas[schema_name], schemas, schema_name)


def _check(value: Any, schema: dict[str, Any], schemas: dict[str, Any], path: str) -> None:
    if "$ref" in schema:
        return _check(value, schemas[schema["$ref"].rsplit("/", 1)[1]], schemas, path)
    if value is None:
        assert schema.get("nullable"), f"{path}: null is not allowed"
        return
    for part in schema.get("allOf", []):
        _check(value, part, schemas, path)
    if "oneOf" in schema:
        _check_one_of(value, schema["oneOf"], schemas, path)
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    kind = schema.get("type")
    if kind in ("integer", "number"):
        allowed = (int,) if kind == "integer" else (int, float)
        assert isinstance(value, allowed) and not isinstance(value, bool), f"{path}: {value!r} is not {kind}"
        assert value >= schema.get("minimum", value), f"{path}: {value} < minimum"
    elif kind is not None:
        assert isinstance(value, _TYPES[kind]), f"{path}: {value!r} is not {kind}"
    if kind == "object":
        for name in schema.get("required", []):
            assert name in value, f"{path}: missing required {name!r}"
        for name, item in value.items():
            if name in schema.get("properties", {}):
                _check(item, schema["properties"][name], schemas, f"{path}.{name}")
    if kind == "array":
        for index, item in enumerate(value):
            _check(item, schema["items"], schemas, f"{path}[{index}]")


def _check_one_of(value: Any, options: list[dict[str, Any]], schemas: dict[str, Any], path: str) -> None:
    failures = []
    for option in options:
        try:
            _check(value, option, schemas, path)
            return
        except AssertionError as exc:
            failures.append(str(exc))
    raise AssertionError(f"{path}: matches none of its options: {failures}")


# -- ztgi's own document (services/gateway/openapi.json) ---------------------------------------

def response_schema(document: dict[str, Any], path: str, method: str, status: int,
                    media_type: str = "application/json") -> dict[str, Any]:
    """The schema our document declares for one answer of one route (KeyError if undeclared)."""
    response = document["paths"][path][method.lower()]["responses"][str(status)]
    return response["content"][media_type]["schema"]


def validate_response(document: dict[str, Any], path: str, method: str, status: int, body: Any,
                      media_type: str = "application/json") -> None:
    """Validates a JSON answer (or one SSE event) against our document, $refs and `nullable` included."""
    from openapi_schema_validator import OAS30Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT4

    response_schema(document, path, method, status, media_type)  # a KeyError names an undeclared answer
    registry = Registry().with_resource("urn:ztgi-openapi", Resource(document, DRAFT4))
    pointer = "/".join(_escape(part) for part in
                       ("paths", path, method.lower(), "responses", str(status), "content", media_type, "schema"))
    OAS30Validator({"$ref": f"urn:ztgi-openapi#/{pointer}"}, registry=registry).validate(body)


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")
