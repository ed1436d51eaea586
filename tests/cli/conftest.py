"""The CLI tests' fixtures: the served API with its fake worker (tests/client/fleet.py)."""

from __future__ import annotations

from tests.client.fleet import served, worker  # noqa: F401  (fixtures, used by name)
