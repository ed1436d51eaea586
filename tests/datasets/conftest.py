"""A fleet's settings over the test's store (a directory, then S3), and files put in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tffleet.datasets.locations import Location, resolve
from tffleet.settings import Settings

TENANT = "acme"


@pytest.fixture
def allowed_dir(tmp_path: Path) -> Path:
    """A directory the operator allows transforms to read and write (file://)."""
    directory = tmp_path / "allowed"
    directory.mkdir()
    return directory


@pytest.fixture
def settings(object_store_url: str, allowed_dir: Path) -> Settings:
    return Settings(
        object_store=object_store_url,
        transform_locations=f"{allowed_dir.as_uri()}/,s3://tffleet-test/allowed/",
    )


@pytest.fixture
def put(settings: Settings):  # type: ignore[no-untyped-def]
    """put(path, data) -> Location: a file written as tffleet://datasets/<path> of TENANT."""

    def put(path: str, data: bytes) -> Location:
        location = resolve(f"tffleet://datasets/{path}", TENANT, settings)
        location.store.put(location.key, data)
        return location

    return put
