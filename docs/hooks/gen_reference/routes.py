"""reference/http.md: every route of the API, from the app's OpenAPI schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gen_reference.markdown import anchor, code, paragraphs, summary, table, text
from gen_reference.schemas import described, shapes, type_of

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")

INTRO = """\
Generated at build time from the OpenAPI schema of the app that `api.app.create_app` makes, so
it lists every route the API serves. A running API serves the same schema at `/openapi.json`
and Swagger UI at `/docs`.

Every route but those marked "No key" (`/healthz`, `/readyz`, the Open Inference Protocol's health
routes and server metadata) takes `Authorization: Bearer <key>` (see [tenants and
keys](../how-to/tenants-and-keys.md)), the schema's `bearer` security scheme: Swagger UI's
Authorize button sends it with every "Try it out"; an error
is answered as `{"error": {"code": ..., "message": ...}}` ([ErrorOut](#schema-errorout)).
"""


def make_app() -> Any:
    from api.app import create_app

    return create_app()


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(METHOD, path, operation) for every operation of the schema, in its order."""
    for path, item in spec.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                yield method.upper(), path, item[method]


def op_anchor(method: str, path: str) -> str:
    return anchor(method, path)


def app_routes(app: Any) -> Iterator[tuple[str, tuple[str, ...], bool, Any]]:
    """(path, methods, in the schema, route) of every route the app serves, mounts included."""
    for route in app.routes:
        # FastAPI 0.12x+ keeps an included router whole and resolves its routes lazily.
        contexts = getattr(route, "effective_route_contexts", None)
        for found in contexts() if contexts else [route]:
            methods = tuple(sorted(getattr(found, "methods", None) or ()))
            yield found.path, methods, getattr(found, "include_in_schema", False), found


def render(app: Any) -> str:
    spec = app.openapi()
    info = spec.get("info", {})
    ops = list(operations(spec))
    out = [
        f"# HTTP API\n\n{INTRO}",
        f"Schema: {text(info.get('title', ''))} {code(info.get('version', ''))}, OpenAPI "
        f"{code(spec.get('openapi', ''))}. {text(info.get('description', ''))}",
        "## Routes",
        table(
            ["Method", "Path", "What it does"],
            [
                [code(m), f"[{code(p)}](#{op_anchor(m, p)})", text(summary(op.get("description")))]
                for m, p, op in ops
            ],
        ),
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for m, p, op in ops:
        by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((m, p, op))
    tag_text = {t["name"]: t.get("description", "") for t in spec.get("tags", [])}
    for tag, tagged in by_tag.items():
        out.append(f"## {text(tag[:1].upper() + tag[1:])}")
        if tag_text.get(tag):
            out.append(paragraphs(tag_text[tag]))
        out += [operation(m, p, op) for m, p, op in tagged]
    out.append(outside_schema(app))
    out.append("## Shapes\n\nThe bodies the routes take and answer, as the schema names them.")
    out.append(shapes(spec.get("components", {}).get("schemas", {})))
    return "\n\n".join(out) + "\n"


def operation(method: str, path: str, op: dict[str, Any]) -> str:
    out = [f"### `{method} {path}` {{ #{op_anchor(method, path)} }}"]
    out.append(paragraphs(op.get("description")) or text(op.get("summary", "")))
    if op.get("deprecated"):
        out.append("**Deprecated.**")
    # The schema requires the bearer scheme of every operation that takes a key (api/openapi.py).
    if not op.get("security"):
        out.append("No key.")
    params = op.get("parameters", [])
    if params:
        rows = [
            [
                code(p["name"]),
                p.get("in", ""),
                type_of(p.get("schema", {})),
                "yes" if p.get("required") else "",
                described(p.get("schema", {}), p.get("description")),
            ]
            for p in params
        ]
        out.append(table(["Parameter", "In", "Type", "Required", "Description"], rows))
    body = op.get("requestBody")
    if body:
        out.append(request_body(body))
    responses = op.get("responses", {})
    if responses:
        rows = [
            [code(status), text(r.get("description", "")), media(r.get("content", {}))]
            for status, r in sorted(responses.items())
        ]
        out.append(table(["Status", "Meaning", "Body"], rows))
    return "\n\n".join(out)


def request_body(body: dict[str, Any]) -> str:
    required = " (required)" if body.get("required") else ""
    words = f"{text(body['description'])} " if body.get("description") else ""
    return f"Request body{required}: {words}{media(body.get('content', {}))}."


def media(content: dict[str, Any]) -> str:
    """Each media type of a body with its shape: `application/json` [JobOut](#...)."""
    parts = []
    for kind, entry in content.items():
        schema = entry.get("schema") or {}
        shape = "" if schema.get("format") == "binary" or not schema else f" {type_of(schema)}"
        parts.append(code(kind) + shape)
    return "; ".join(parts)


def outside_schema(app: Any) -> str:
    """The routes the schema leaves out: Swagger UI, the schema itself, the console, files."""
    rows = []
    for path, methods, in_schema, route in app_routes(app):
        if in_schema:
            continue
        endpoint = getattr(route, "endpoint", None)
        what = summary(getattr(endpoint, "__doc__", None))
        if path == getattr(app, "openapi_url", None):
            what = "This schema, as JSON."
        elif not what and hasattr(route, "app") and not methods:
            what = f"files ({type(route.app).__name__})"
        rows.append([code(" ".join(methods) or "GET"), code(path), text(what)])
    return "## Outside the schema\n\n" + table(["Methods", "Path", "What it serves"], rows)
