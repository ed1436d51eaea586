"""What the object store's tests share, and others that need a store that is down."""

from __future__ import annotations

import pytest

from tffleet.cli.process_group import free_port
from tffleet.objectstore import ObjectStore, open_store


def dead_store(monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    """An S3 store whose endpoint answers nothing (nothing listens on its port): every call is
    StoreUnavailable, after a short retry (0.2 s)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    return open_store("s3://tffleet-test/x", retry_s=0.2)
