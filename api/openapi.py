"""What the OpenAPI schema says that FastAPI cannot infer: the job routes' bodies, which they read
themselves (to answer 400/413/415 before validating), their binary bodies and answers (.npz,
.npy), and the headers and query parameters they read by hand, with examples; and which
operations take a key (the bearer scheme, so /docs has an Authorize button).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from api.schemas import JobBatchCreate, JobCreate, JobStatusQuery
from api.transform_schemas import TransformCreate
from tffleet import tensors

# Request bodies the routes read themselves, so FastAPI does not list their schemas: the
# routes' `openapi_extra` below refers to them by name.
_BODY_SCHEMAS = (JobCreate, JobBatchCreate, JobStatusQuery, TransformCreate)


# Swagger UI's Authorize button sends `Authorization: Bearer <key>`, as `api/auth.py` reads it.
BEARER = "bearer"
_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "An API key: `tffleet keys create --tenant NAME` (`--admin` for the admin "
    "routes); `tffleet up` writes one to `.tffleet/admin.key`.",
}
# The operations that call no `state.auth`: probes and the protocol's server metadata. The routes
# read the key by hand (not a dependency, which costs more than the call), so FastAPI cannot see
# which take one: every other operation does, and `tests/api/test_openapi.py` calls each one
# without a key to hold this list to the code.
UNKEYED = frozenset(
    {
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/v2"),
        ("get", "/v2/health/live"),
        ("get", "/v2/health/ready"),
    }
)


def with_body_schemas(app: FastAPI, *, auth: bool = True, metrics_public: bool = False) -> Any:
    """`app.openapi`, with the schemas of `_BODY_SCHEMAS` among the components and the bearer
    scheme required by every operation that takes a key (none with `auth` off; `/metrics` none
    while `metrics_public`)."""
    make_openapi = app.openapi
    unkeyed = UNKEYED | ({("get", "/metrics")} if metrics_public else set())

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = make_openapi()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in _BODY_SCHEMAS:
                found = model.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, nested in found.pop("$defs", {}).items():
                    components.setdefault(name, nested)
                components.setdefault(model.__name__, found)
            if auth:
                _declare_bearer(schema, unkeyed)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


def _declare_bearer(schema: dict[str, Any], unkeyed: frozenset[tuple[str, str]]) -> None:
    schema["components"].setdefault("securitySchemes", {})[BEARER] = _SCHEME
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            if (method, path) not in unkeyed:
                operation["security"] = [{BEARER: []}]


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
_QUEUE_TIMEOUT_PARAMETER = {
    "name": "Queue-Timeout",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": 40, "examples": ["30", "1.5", "90s", "5m"]},
    "description": "Cancel each job no worker started this long after it is stored, without "
    "running it (error `queue_timeout`): seconds, or a Go-style duration.",
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
    "parameters": [
        _IDEMPOTENCY_KEY_PARAMETER,
        _CANCEL_AFTER_PARAMETER,
        _QUEUE_TIMEOUT_PARAMETER,
        *_BINARY_PARAMETERS,
    ],
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
RETRY = {"parameters": [_CANCEL_AFTER_PARAMETER, _QUEUE_TIMEOUT_PARAMETER]}
# POST /v1/transforms: the same key and request again, the same transform.
TRANSFORM_SUBMIT = {
    "parameters": [_IDEMPOTENCY_KEY_PARAMETER],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/TransformCreate"}}
        },
    },
}
