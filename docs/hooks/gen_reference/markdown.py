"""Small Markdown helpers shared by the reference pages: text from code, made safe to print."""

from __future__ import annotations

import inspect
import re

# Outside code spans, characters that Markdown or HTML would take as markup. Docstrings, help
# texts and comments are written as plain text with `code` in backticks, nothing else.
_MARKUP = re.compile(r"([\\*_<>\[\]])")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_PIPE = re.compile(r"(\|)")
_LIST_ITEM = re.compile(r"\s*(?:[-*]|\d+\.)\s")


def _outside_code(value: str, pattern: re.Pattern[str]) -> str:
    """`value` with what `pattern` finds escaped by a backslash, except in code spans."""
    out: list[str] = []
    end = 0
    for found in _CODE_SPAN.finditer(value):
        out.append(pattern.sub(r"\\\1", value[end : found.start()]))
        out.append(found.group(0))
        end = found.end()
    out.append(pattern.sub(r"\\\1", value[end:]))
    return "".join(out)


def text(value: str | None) -> str:
    """Plain text (backtick code spans kept) as Markdown: markup characters escaped."""
    return _outside_code(value, _MARKUP) if value else ""


def paragraphs(value: str | None) -> str:
    """A docstring or description: its paragraphs and list items kept, other lines joined."""
    if not value:
        return ""
    out: list[str] = []
    for block in re.split(r"\n\s*\n", inspect.cleandoc(value)):
        items: list[list[str]] = []
        for line in block.splitlines():
            if _LIST_ITEM.match(line) or not items:
                items.append([])
            items[-1].append(line.strip())
        joined = [text(" ".join(item)) for item in items]
        if len(joined) > 1 and not _LIST_ITEM.match(items[0][0]):
            joined[0] += "\n"  # Markdown starts a list only after a blank line
        out.append("\n".join(joined))
    return "\n\n".join(out)


def summary(value: str | None) -> str:
    """The first paragraph of a docstring, on one line."""
    if not value:
        return ""
    return " ".join(inspect.cleandoc(value).split("\n\n")[0].split())


def cell(value: str) -> str:
    """A table cell: one line, pipes escaped (the table extension leaves code spans whole)."""
    return _outside_code(" ".join(value.split()), _PIPE) or " "


def code(value: object) -> str:
    """A code span that holds any text, backticks included."""
    s = str(value)
    fence = "``" if "`" in s else "`"
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def anchor(*parts: str) -> str:
    """A stable heading id: lowercase letters, digits, `_` and `-`."""
    joined = "-".join(parts).lower()
    return re.sub(r"[^a-z0-9_]+", "-", joined).strip("-")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
