"""JSON Schema (as FastAPI writes it into OpenAPI) in words: a type, its bounds, and the shapes."""

from __future__ import annotations

from typing import Any

from gen_reference.markdown import anchor, code, paragraphs, table, text

_BOUNDS = (
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "length ≥ {}"),
    ("maxLength", "length ≤ {}"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
)


def schema_link(name: str) -> str:
    return f"[{name}](#{anchor('schema', name)})"


def type_of(schema: dict[str, Any] | bool) -> str:
    """A schema's type as Markdown: `integer`, `string (date-time)`, a shape's link, `a or b`."""
    if not isinstance(schema, dict) or not schema:
        return code("any")
    if "$ref" in schema:
        return schema_link(schema["$ref"].rsplit("/", 1)[-1])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(dict.fromkeys(type_of(s) for s in schema[key]))
    if "allOf" in schema:
        return " and ".join(type_of(s) for s in schema["allOf"])
    if "const" in schema:
        return code(_json(schema["const"]))
    if "enum" in schema:
        return "one of " + ", ".join(code(_json(v)) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(type_of({**schema, "type": k}) for k in kind)
    if kind == "array":
        items = schema.get("items")
        return code("array") + (f" of {type_of(items)}" if items else "")
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return code("object") + f" of {type_of(extra)}"
        return code("object")
    if kind is None:
        return code("any")
    fmt = schema.get("format")
    return code(kind) + (f" ({fmt})" if fmt else "")


def bounds(schema: dict[str, Any]) -> str:
    """What a schema allows beyond its type, and its default: `≥ 0, ≤ 30; default 0`."""
    found = [rule.format(_json(schema[key])) for key, rule in _BOUNDS if key in schema]
    if "pattern" in schema:
        found.append(f"matches {code(schema['pattern'])}")
    if schema.get("default") is not None:  # a default of null says no more than "optional"
        found.append(f"default {code(_json(schema['default']))}")
    examples = schema.get("examples")
    if isinstance(examples, list) and examples:
        found.append("e.g. " + ", ".join(code(_json(e)) for e in examples))
    return "; ".join(found)


def described(schema: dict[str, Any], description: str | None = None) -> str:
    """A field's or parameter's description followed by its bounds, on one line."""
    words = text(" ".join((description or schema.get("description") or "").split()))
    extra = bounds(schema)
    return f"{words} ({extra})" if words and extra else words or extra


def shapes(components: dict[str, Any]) -> str:
    """Every named shape of `components.schemas`, each with its fields."""
    out: list[str] = []
    for name in sorted(components):
        schema = components[name]
        out.append(f"### {name} {{ #{anchor('schema', name)} }}")
        if schema.get("description"):
            out.append(paragraphs(schema["description"]))
        properties = schema.get("properties")
        if properties:
            required = set(schema.get("required", ()))
            rows = [
                [code(field), type_of(prop), "yes" if field in required else "", described(prop)]
                for field, prop in properties.items()
            ]
            out.append(table(["Field", "Type", "Required", "Description"], rows))
        else:
            out.append(f"Type: {type_of(schema)}.")
    return "\n\n".join(out)


def _json(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return str(value)
