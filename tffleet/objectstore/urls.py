"""Where a TFFLEET_OBJECT_STORE URL points, checked without touching the store (`parse_store_url`):
the settings check it at load, `open_store` (store.py) opens what it names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

# S3's rule for bucket names (dots allowed; the endpoint is addressed by path, not host).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class StoreLocation:
    """Where a TFFLEET_OBJECT_STORE URL points, checked but not opened: a directory, or an S3
    bucket and the prefix under it."""

    scheme: str  # "file" or "s3"
    directory: Path | None = None
    bucket: str | None = None
    prefix: str | None = None


def parse_store_url(url: str) -> StoreLocation:
    """Check a TFFLEET_OBJECT_STORE URL without touching the store (the settings do it at load):
    `file:///absolute/dir`, `file:relative/dir` (to the current directory, as the default is),
    or `s3://bucket[/prefix]`. Anything else is a ValueError naming the setting."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"TFFLEET_OBJECT_STORE={url!r}: no ?query or #fragment is taken")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise ValueError(
                f"TFFLEET_OBJECT_STORE={url!r}: a directory store is file:///absolute/dir "
                "or file:relative/dir"
            )
        return StoreLocation("file", directory=Path(unquote(parts.path)))
    if parts.scheme == "s3":
        # Credentials never go in the URL (it is logged and shown): they come from the
        # environment or an instance role, so user:password@ is refused, as are hosts that
        # are no bucket name (the endpoint is AWS_ENDPOINT_URL).
        if "@" in parts.netloc or not _BUCKET.fullmatch(parts.netloc):
            raise ValueError(
                f"TFFLEET_OBJECT_STORE={url!r}: an S3 store is s3://bucket[/prefix], the bucket "
                "3-63 characters of a-z 0-9 . -; credentials come from AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, the endpoint from AWS_ENDPOINT_URL, never the URL"
            )
        prefix = unquote(parts.path).strip("/") or None
        if prefix is not None and any(part in ("", ".", "..") for part in prefix.split("/")):
            raise ValueError(f"TFFLEET_OBJECT_STORE={url!r}: the prefix has an empty, . or .. part")
        return StoreLocation("s3", bucket=parts.netloc, prefix=prefix)
    raise ValueError(f"TFFLEET_OBJECT_STORE={url!r}: expected file:///dir or s3://bucket[/prefix]")
