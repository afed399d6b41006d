"""The daemon's own OpenAPI document, GET /openapi.json (behind the token, like every route).

Routes read their JSON bodies themselves (server/validation.py: size limit first, then our error shape),
so FastAPI cannot see their request models. A route names its model with
`openapi_extra=request_body(Model)`, and the document then carries the model's JSON schema: what
clients may send, and what the fuzz test (tests/test_fuzz.py, schemathesis) generates from.
document() adds the token's two forms as security schemes (/health needs none).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "the token from the file `lingcode serve` prints"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": "the same token"},
}


def request_body(model: type[BaseModel]) -> dict:
    """openapi_extra for a route that reads a JSON body of this model itself."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _inline(schema, defs)}}}}


def _inline(node: object, defs: dict, seen: tuple[str, ...] = ()) -> object:
    """The schema with every `#/$defs/X` reference replaced by X itself (the document has no $defs)."""
    if isinstance(node, list):
        return [_inline(item, defs, seen) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        if name in seen:
            raise ValueError(f"request model {name} is recursive; request_body() cannot inline it")
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**defs[name], **rest}, defs, (*seen, name))
    return {key: _inline(value, defs, seen) for key, value in node.items()}


def document(app: FastAPI, open_paths: frozenset[str]) -> dict:
    """The OpenAPI document of `app` (built once), with its auth."""
    if app.openapi_schema is None:
        doc = get_openapi(
            title=app.title,
            version=app.version,
            routes=app.routes,
            description="lingcode's daemon: OpenAI-compatible routes and its own, on one model.",
        )
        doc.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
        doc["security"] = [{"bearer": []}, {"apiKey": []}]
        for path in open_paths:
            for operation in doc.get("paths", {}).get(path, {}).values():
                operation["security"] = []
        app.openapi_schema = doc
    return app.openapi_schema
