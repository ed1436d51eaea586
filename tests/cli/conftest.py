"""The CLI tests' fixtures: the served API with its fake worker (tests/client/fleet.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.client.fleet import served, worker  # noqa: F401  (fixtures, used by name)
from tffleet.settings import get_settings


@pytest.fixture(autouse=True)
def _served_key(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test of the served API runs its commands with that API's admin key."""
    if "served" in request.fixturenames:
        monkeypatch.setenv("TFFLEET_API_KEY", request.getfixturevalue("served").api_key)


@pytest.fixture
def database(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The database the command uses: the one the `sessions` fixture writes to."""
    monkeypatch.setenv("TFFLEET_DATABASE_URL", db_url)
    get_settings.cache_clear()
    yield db_url
    get_settings.cache_clear()
