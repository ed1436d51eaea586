"""reference/configuration.md: every field of `tffleet.settings.Settings`, its variable and words.

A field's words are its `Field(description=...)` if it has one, else the comment above it in
tffleet/settings.py, the way that file documents them: a comment block covers the fields below
it up to the next blank line, so a group of fields may share one.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gen_reference.markdown import anchor, code, paragraphs, table

INTRO = """\
Generated at build time from `tffleet.settings.Settings`, so it lists every setting. Each is
read from an environment variable, its name the field's in capitals after `TFFLEET_`, once when
a process starts; the processes a command starts inherit them. The `tffleet` commands set some
from their options ([command line](cli.md)), and `tffleet up` writes the ones a fleet shares to
`.tffleet/fleet.env`, which other `tffleet` commands and the Python client read.

A value that does not parse, or that breaks a bound, stops the process at start with a message
naming the setting.
"""

# The packages whose code may read a variable of ours that is not a setting.
PACKAGES = ("tffleet", "api", "db", "worker")
_VARIABLE = re.compile(r"[\"'](TFFLEET_[A-Z0-9_]+)[\"']")
_BOUNDS = (("gt", "> {}"), ("ge", "≥ {}"), ("lt", "< {}"), ("le", "≤ {}"))


@dataclass
class Entry:
    name: str
    variable: str
    annotation: str
    source_default: str | None
    words: str
    group: int


def settings_class() -> Any:
    from tffleet.settings import Settings

    return Settings


def entries(cls: Any) -> list[Entry]:
    """Every field in the order of the source, with its words and the group it belongs to."""
    source = Path(inspect.getsourcefile(cls) or "").read_text(encoding="utf-8")
    lines = source.splitlines()
    body = next(
        n.body
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.ClassDef) and n.name == cls.__name__
    )
    inline = {
        t.start[0]: t.string.lstrip("#").strip()
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type == tokenize.COMMENT and t.line.strip() != t.string.strip()
    }
    prefix = cls.model_config.get("env_prefix", "")
    found: list[Entry] = []
    shared, group, previous_end = "", 0, -1
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            previous_end = -1
            continue
        above, comment = node.lineno - 1, list[str]()
        while above >= 1 and lines[above - 1].strip().startswith("#"):
            comment.insert(0, lines[above - 1].strip().lstrip("#").strip())
            above -= 1
        # A field right below another, with no comment of its own, shares that one's words.
        if comment or previous_end != node.lineno - 1:
            shared, group = " ".join(comment), group + 1
        previous_end = node.end_lineno or node.lineno
        name = node.target.id
        own = cls.model_fields[name].description
        words = own or " ".join(w for w in (shared, inline.get(node.lineno)) if w)
        found.append(
            Entry(
                name=name,
                variable=f"{prefix}{name}".upper(),
                annotation=ast.unparse(node.annotation),
                source_default=_source_default(node.value),
                words=words,
                group=-len(found) - 1 if own or node.lineno in inline else group,
            )
        )
    return found


def _source_default(value: ast.expr | None) -> str | None:
    """The default as written (`7 * 24 * 3600.0`), if it is written as an expression."""
    if value is None:
        return None
    if isinstance(value, ast.Call):
        for keyword in value.keywords:
            if keyword.arg == "default":
                value = keyword.value
                break
        else:
            return None
    return None if isinstance(value, ast.Constant) else ast.unparse(value)


def facts(cls: Any, entry: Entry) -> str:
    info = cls.model_fields[entry.name]
    out = [f"Type {code(entry.annotation)}"]
    if info.is_required():
        out.append("required")
    else:
        out.append(f"default {code(_env_value(info.default))}")
        if entry.source_default and entry.source_default != _env_value(info.default):
            out[-1] += f" ({code(entry.source_default)})"
    for rule in info.metadata:
        out += [fmt.format(getattr(rule, key)) for key, fmt in _BOUNDS if hasattr(rule, key)]
    out.append(f"field `Settings.{entry.name}`")
    return " · ".join(out) + "."


def _first_sentence(words: str, longest: int = 140) -> str:
    """The words' first sentence for the summary table; a long one up to its first clause, with
    an ellipsis. Never cut inside a code span."""
    marks = re.finditer(r"[.;:](?=\s|$)", words)
    ends = [m for m in marks if not words[: m.start()].count("`") % 2]
    sentence = next((m.end() for m in ends if m.group() == "."), len(words))
    if sentence <= longest:
        return words[:sentence]
    clause = next((m.start() for m in ends if m.group() in ";:"), None)
    return words[:clause] + " …" if clause is not None and clause < sentence else words[:sentence]


def _env_value(value: object) -> str:
    """A value as it would be written in the environment."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def other_variables(cls: Any, root: Path) -> dict[str, list[str]]:
    """The `TFFLEET_*` names the code uses that are not settings, with the files that use them."""
    settings = {e.variable for e in entries(cls)}
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for name in _VARIABLE.findall(path.read_text(encoding="utf-8")):
                users = found.setdefault(name, [])
                where = path.relative_to(root).as_posix()
                if name not in settings and where not in users:
                    users.append(where)
    return {name: users for name, users in sorted(found.items()) if name not in settings}


def render() -> str:
    cls = settings_class()
    found = entries(cls)
    rows, words_of = [], dict[int, str]()
    for e in found:
        info = cls.model_fields[e.name]
        default = "" if info.is_required() else code(_env_value(info.default))
        gist = _first_sentence(words_of.setdefault(e.group, e.words))
        rows.append(
            [f"[{code(e.variable)}](#{anchor(e.variable)})", code(e.annotation), default, gist]
        )
    out = [
        f"# Configuration\n\n{INTRO}",
        table(["Variable", "Type", "Default", "What it is"], rows),
        "## Settings",
    ]
    first_of: dict[int, Entry] = {}
    for e in found:
        out.append(f"### `{e.variable}` {{ #{anchor(e.variable)} }}")
        out.append(facts(cls, e))
        lead = first_of.setdefault(e.group, e)
        if lead is not e and e.words:
            out.append(
                f"One of the group described at [{code(lead.variable)}](#{anchor(lead.variable)})."
            )
        elif e.words:
            out.append(paragraphs(e.words))
    root = Path(inspect.getsourcefile(cls) or "").resolve().parents[1]
    others = other_variables(cls, root)
    if others:
        out.append(
            "## Other variables\n\nUsed outside `Settings`, by a command or the client: "
            "what each is for is in the file that reads it."
        )
        out.append(
            table(
                ["Variable", "Used in"],
                [[code(n), ", ".join(code(u) for u in users)] for n, users in others.items()],
            )
        )
    return "\n\n".join(out) + "\n"
