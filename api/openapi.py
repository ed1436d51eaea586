"""What the OpenAPI schema says that FastAPI cannot infer: the job routes' bodies, which they read
themselves (to answer 400/413/415 before validating), their binary bodies and answers (.npz,
.npy), and the headers and query parameters they read by hand, with examples.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from api.schemas import JobBatchCreate, JobCreate, JobStatusQuery
from tffleet import tensors

# Request bodies the routes read themselves, so FastAPI does not list their schemas: the
# routes' `openapi_extra` below refers to them by name.
_BODY_SCHEMAS = (JobCreate, JobBatchCreate, JobStatusQuery)


def with_body_schemas(app: FastAPI) -> Any:
    """`app.openapi`, with the schemas of `_BODY_SCHEMAS` among the components."""
    make_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = make_openapi()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in _BODY_SCHEMAS:
                found = model.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, nested in found.pop("$defs", {}).items():
                    components.setdefault(name, nested)
                components.setdefault(model.__name__, found)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


# A binary body or answer (.npz, .npy), and the query parameters a binary body comes with.
_BINARY_SCHEMA = {"schema": {"type": "string", "format": "binary"}}
_BINARY_PARAMETERS = [
    {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": f"With a binary body only (a JSON body gives it in the body): {text}",
    }
    for name, schema, text in (
        ("model", {"type": "string", "maxLength": 200}, "the model; required."),
        ("version", {"type": "integer", "minimum": 1}, "the model's version."),
        ("priority", {"type": "integer", "minimum": -1000, "maximum": 1000}, "the priority."),
        ("ttl_s", {"type": "integer", "minimum": 1}, "keep the job this long after it ends."),
        ("webhook", {"type": "string", "maxLength": 2000}, "an http(s) URL for its webhooks."),
        (
            "webhook_events",
            {"type": "string", "examples": ["completed", "start,completed"]},
            "the webhook's events, comma-separated.",
        ),
    )
]
_CANCEL_AFTER_PARAMETER = {
    "name": "Cancel-After",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": 40, "examples": ["30", "1.5", "90s", "1h30m"]},
    "description": "Cancel each job not ended this long after it is stored (error `deadline`): "
    "seconds, or a Go-style duration.",
}
_IDEMPOTENCY_KEY_PARAMETER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": 128},
    "description": "The same key and body again: the same job, nothing new stored.",
}

# An answer that may be an .npz of the job's outputs (`Accept: application/x-npz`).
NPZ_ANSWER = {"content": {tensors.NPZ: _BINARY_SCHEMA}}

# `openapi_extra` of each job route that needs one.
SUBMIT = {
    "parameters": [_IDEMPOTENCY_KEY_PARAMETER, _CANCEL_AFTER_PARAMETER, *_BINARY_PARAMETERS],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"$ref": "#/components/schemas/JobCreate"},
                        {"$ref": "#/components/schemas/JobBatchCreate"},
                    ]
                }
            },
            tensors.NPZ: _BINARY_SCHEMA,
            tensors.NPY: _BINARY_SCHEMA,
        },
    },
}
STATUS = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/JobStatusQuery"}}
        },
    }
}
RETRY = {"parameters": [_CANCEL_AFTER_PARAMETER]}
