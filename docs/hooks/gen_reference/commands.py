"""reference/cli.md: every `tffleet` command and option, from the argparse parsers themselves."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from gen_reference.markdown import anchor, code, paragraphs, table, text

INTRO = """\
Generated at build time from the parsers of `tffleet.cli.main.build_parser`, so it lists every
command and option. Every command also takes `-h` / `--help`, which prints the same help.

Options that name a setting (`--devices`, `--models`, `--host`, `--port`, ...) set its
`TFFLEET_*` variable for the process and the ones it starts; the rest comes from the environment
(see [configuration](configuration.md)). `tffleet` commands other than `up` use the settings of
a `tffleet up` running from the same directory, unless the environment sets them.
"""


def make_parser() -> argparse.ArgumentParser:
    from tffleet.cli.main import build_parser

    return build_parser()


Parser = argparse.ArgumentParser


def _subcommands(parser: Parser) -> Iterator[tuple[str, str, Parser]]:
    """(name, one-line help, parser) of each subcommand of `parser`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """Every command, depth first: (its words after `tffleet`, its one-line help, its parser)."""
    for name, help_text, sub in _subcommands(parser):
        yield (*words, name), help_text, sub
        yield from commands(sub, (*words, name))


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The options and positional arguments of a parser, `--help` and subcommands left out."""
    for action in parser._actions:
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            yield action


def command_anchor(words: tuple[str, ...]) -> str:
    return anchor("tffleet", *words)


def render(parser: argparse.ArgumentParser) -> str:
    found = list(commands(parser))
    out = [
        f"# Command line\n\n{INTRO}",
        table(
            ["Command", "What it does"],
            [
                [f"[{code(' '.join(('tffleet', *w)))}](#{command_anchor(w)})", text(h)]
                for w, h, _ in found
            ],
        ),
        section(("tffleet",), parser, "", level=2, anchor_id="tffleet"),
    ]
    out += [
        section(("tffleet", *w), sub, h, level=2 + min(len(w) - 1, 1), anchor_id=command_anchor(w))
        for w, h, sub in found
    ]
    return "\n\n".join(out) + "\n"


def section(
    words: tuple[str, ...], parser: argparse.ArgumentParser, help_text: str, *, level: int,
    anchor_id: str,
) -> str:  # fmt: skip
    out = [f"{'#' * level} `{' '.join(words)}` {{ #{anchor_id} }}"]
    lead = help_text[:1].upper() + help_text[1:]
    if lead:
        out.append(text(lead if lead.endswith(".") else lead + "."))
    if parser.description and parser.description.strip() != help_text.strip():
        out.append(paragraphs(parser.description))
    prefix = "usage: "  # argparse indents the lines after the first past it
    usage = "\n".join(
        line.removeprefix(" " * len(prefix))
        for line in parser.format_usage().removeprefix(prefix).rstrip().splitlines()
    )
    out.append(f"```text\n{usage}\n```")
    rows = [option_row(parser, action) for action in options(parser)]
    if rows:
        out.append(table(["Option", "Value", "Default", "Description"], rows))
    subs = [name for name, _, _ in _subcommands(parser)]
    if subs:
        listed = ", ".join(f"[{code(n)}](#{anchor(anchor_id, n)})" for n in subs)
        out.append(f"Commands: {listed}.")
    if parser.epilog:
        out.append(paragraphs(parser.epilog))
    return "\n\n".join(out)


def option_row(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    """Option | Value | Default | Description of one argument."""
    names = ", ".join(code(s) for s in action.option_strings) or code(_metavar(action))
    if action.option_strings:
        value = code(_metavar(action)) if action.nargs != 0 else ""
    else:
        value = {"+": "one or more", "*": "any number", "?": "optional"}.get(str(action.nargs), "")
    if action.choices and not isinstance(action.choices, dict):
        value += " one of " + ", ".join(code(c) for c in action.choices)
    default = action.default
    flag = action.nargs == 0  # store_true and the like: their default goes without saying
    unset = flag or default is None or default is False or default == argparse.SUPPRESS
    description = text(_help(parser, action))
    if action.required and action.option_strings:
        description = f"Required. {description}".strip()
    return [names, value.strip(), "" if unset else code(default), description]


def _metavar(action: argparse.Action) -> str:
    metavar = action.metavar
    if isinstance(metavar, tuple):
        return " ".join(metavar)
    return metavar or (action.dest.upper() if action.option_strings else action.dest)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    help_text = action.help or ""
    if help_text == argparse.SUPPRESS:
        return ""
    if "%" in help_text:  # argparse's own expansion: %(default)s, %(prog)s, ...
        values = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        with contextlib.suppress(KeyError, TypeError, ValueError):  # then as written
            help_text = help_text % {**values, "prog": parser.prog}
    return help_text
