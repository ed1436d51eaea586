"""The reference pages of the documentation site, generated from the code.

`pages()` answers {path under docs/: Markdown} for reference/http.md (the app's OpenAPI schema),
reference/cli.md (the `tffleet` parsers), reference/configuration.md (`Settings`) and
reference/metrics.md (the Prometheus metrics of api/ and worker/). docs/hooks/reference.py runs
`python -m gen_reference` at every build, in a process of its own, and adds them to the site.
It never imports TensorFlow (metrics.py checks).
"""

from __future__ import annotations

from collections.abc import Callable

from gen_reference import commands, configuration, metrics, routes

PAGES: dict[str, Callable[[], str]] = {
    "reference/http.md": lambda: routes.render(routes.make_app()),
    "reference/cli.md": lambda: commands.render(commands.make_parser()),
    "reference/configuration.md": configuration.render,
    "reference/metrics.md": metrics.render,
}


def pages() -> dict[str, str]:
    return {path: make() for path, make in PAGES.items()}
