"""The client tests' fixtures: the anyio backend, and the served API with its fake worker."""

from __future__ import annotations

import pytest

from tests.client.fleet import served, worker  # noqa: F401  (fixtures, used by name)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
