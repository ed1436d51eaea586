"""What a transform may read and write, and where that is (DESIGN §14).

A transform names its files by URI. Three kinds are taken, nothing else (no http(s)://, no
host the fleet would fetch from on a caller's word):

    tffleet://datasets/<path>          the fleet's own store, key <tenant>/datasets/<path>
    tffleet://transforms/<id>/<path>   the same, key <tenant>/transforms/<id>/<path> (outputs)
    file:///dir/..., s3://bucket/...   under a prefix of TFFLEET_TRANSFORM_LOCATIONS

The tenant of a `tffleet://` URI is the caller's, never the URI's, so no URI names another
tenant's objects; and a `file://` or `s3://` URI inside the fleet's own store is refused (it
would reach every tenant's objects): those are named by `tffleet://`. No part of a path may be
empty, `.` or `..`. `resolve` gives one file's `Location`; `expand` turns a prefix (a URI ending
in `/`, or naming no object but objects under it) or a list of URIs into the files they hold.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from tffleet.objectstore.store import ObjectStore, open_store
from tffleet.objectstore.urls import parse_store_url

if TYPE_CHECKING:
    from tffleet.settings import Settings

FLEET_SCHEME = "tffleet"
# The folders of a tenant's part of the store that transforms may name, and what they hold.
FLEET_FOLDERS = ("datasets", "transforms")


class LocationRefused(ValueError):
    """A URI a transform may not read or write; the message names the URI and why."""


@dataclass(frozen=True)
class Location:
    """One object: the store that holds it, its key there, and the URI the caller wrote."""

    store: ObjectStore
    key: str
    uri: str


@dataclass(frozen=True)
class Allowed:
    """One prefix of TFFLEET_TRANSFORM_LOCATIONS: a directory, or a bucket and a key prefix."""

    url: str
    directory: Path | None = None
    bucket: str | None = None
    prefix: str = ""  # an S3 key prefix, "" or ending in "/"


def parse_allowed(text: str) -> list[Allowed]:
    """TFFLEET_TRANSFORM_LOCATIONS, comma-separated prefixes (`file:///srv/datasets/`,
    `s3://bucket/prefix/`); a ValueError naming the one that is not such a prefix."""
    allowed: list[Allowed] = []
    for url in (part.strip() for part in text.split(",")):
        if not url:
            continue
        if not url.startswith(("file:///", "s3://")):
            raise ValueError(
                f"TFFLEET_TRANSFORM_LOCATIONS: {url!r} is neither file:///absolute/dir/ nor "
                "s3://bucket/prefix/"
            )
        try:
            where = parse_store_url(url.rstrip("/"))
        except ValueError as exc:
            raise ValueError(f"TFFLEET_TRANSFORM_LOCATIONS: {url!r}: {exc}") from None
        if where.directory is not None:
            allowed.append(Allowed(url, directory=where.directory))
        else:
            prefix = f"{where.prefix}/" if where.prefix else ""
            allowed.append(Allowed(url, bucket=where.bucket, prefix=prefix))
    return allowed


def resolve(uri: str, tenant: str, settings: Settings, *, write: bool = False) -> Location:
    """The object a transform's URI names, if it may read it (or write it, `write`); else
    `LocationRefused` naming the URI. Nothing is read: the object may not exist (yet)."""
    doing = "written" if write else "read"
    parts = urlsplit(uri)
    if parts.query or parts.fragment:
        raise LocationRefused(f"{uri}: a location takes no ?query or #fragment")
    path = unquote(parts.path)
    if parts.scheme == FLEET_SCHEME:
        return _fleet(uri, parts.netloc, path, tenant, settings, write=write)
    if parts.scheme in ("file", "s3"):
        _check_parts(uri, path.lstrip("/"), allow_folder=True, write=write)
        return _allowed(uri, parts.scheme, parts.netloc, path, settings, doing)
    raise LocationRefused(
        f"{uri}: a transform's files are tffleet://datasets/..., or file:// and s3:// under "
        f"TFFLEET_TRANSFORM_LOCATIONS; {parts.scheme or 'a bare path'}:// is never {doing}"
    )


def _check_parts(uri: str, path: str, *, allow_folder: bool, write: bool) -> None:
    """No empty, `.` or `..` part anywhere (a trailing `/` of a folder aside); to be written,
    no part ending with `:` or `|`."""
    parts = path.split("/")
    if allow_folder and len(parts) > 1 and parts[-1] == "":
        parts = parts[:-1]
    if any(part in ("", ".", "..") for part in parts):
        raise LocationRefused(f"{uri}: a path may have no empty, . or .. part")
    # obstore's directory store cannot stage a file whose name ends so (it fails the rename
    # into place: a 503 that is the name's fault); refused for a write on every store, so a name
    # is good wherever the fleet's store lives. Reading such a file is left alone.
    if write and any(part.endswith((":", "|")) for part in parts):
        raise LocationRefused(f"{uri}: a path's part may not end with ':' or '|'")


def _fleet(
    uri: str, folder: str, path: str, tenant: str, settings: Settings, *, write: bool
) -> Location:
    if folder not in FLEET_FOLDERS:
        raise LocationRefused(
            f"{uri}: the fleet's store holds a transform's files under "
            f"tffleet://datasets/ and tffleet://transforms/, not tffleet://{folder}/"
        )
    path = path.lstrip("/")
    if not path:
        raise LocationRefused(f"{uri}: names no file or folder under tffleet://{folder}/")
    _check_parts(uri, path, allow_folder=True, write=write)
    return Location(_fleet_store(settings.object_store), f"{tenant}/{folder}/{path}", uri)


def _allowed(
    uri: str, scheme: str, host: str, path: str, settings: Settings, doing: str
) -> Location:
    own = parse_store_url(settings.object_store)
    for allowed in parse_allowed(settings.transform_locations):
        if scheme == "file" and allowed.directory is not None and host in ("", "localhost"):
            inside = _under(path, allowed.directory)
            if inside is not None:
                if own.directory is not None and _under(path, own.directory) is not None:
                    break  # the fleet's own store: refused below
                root = allowed.directory.resolve()
                return Location(_store(root.as_uri()), inside, uri)
        if scheme == "s3" and allowed.bucket == host:
            key = path.lstrip("/")
            if key.startswith(allowed.prefix):
                if own.bucket == host and key.startswith(f"{own.prefix}/" if own.prefix else ""):
                    break
                return Location(_store(f"s3://{host}"), key, uri)
    raise LocationRefused(
        f"{uri}: not under a location the fleet allows to be {doing} (TFFLEET_TRANSFORM_LOCATIONS"
        "; the fleet's own store is named tffleet://datasets/...)"
    )


def _under(path: str, directory: Path) -> str | None:
    """`path` as a key relative to `directory`, if it is inside it once links are followed
    (a link out of an allowed directory leads nowhere); a trailing `/` is kept (a folder)."""
    try:
        relative = Path(path).resolve().relative_to(directory.resolve())
    except ValueError:
        return None
    key = relative.as_posix()
    folder = path.endswith("/")
    if key == ".":
        return "" if folder else None
    return key + ("/" if folder else "")


_stores: dict[tuple[str, ...], ObjectStore] = {}
_stores_lock = threading.Lock()
# What an S3 store is opened with from the environment: a store is reused while these hold.
_S3_ENVIRONMENT = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)


def _store(url: str) -> ObjectStore:
    """One store per directory or bucket, opened once (S3: the fleet's AWS_* credentials)."""
    cache_key = (url, *(os.environ.get(name, "") for name in _S3_ENVIRONMENT))
    with _stores_lock:
        found = _stores.get(cache_key)
        if found is None:
            found = _stores[cache_key] = open_store(url)
        return found


def _fleet_store(url: str) -> ObjectStore:
    return _store(url)


def expand(
    uris: str | list[str], tenant: str, settings: Settings, *, write: bool = False
) -> list[Location]:
    """The files a transform's input names: each URI that names an object is that file; a
    prefix (ending in `/`, or naming no object but some under it) is the files under it, in
    sorted order, without names starting with `.` or `_` (a writer's `_SUCCESS`, `.crc`
    files). A prefix that holds nothing, or a file that is missing, is a LocationRefused."""
    files: list[Location] = []
    for uri in [uris] if isinstance(uris, str) else uris:
        location = resolve(uri, tenant, settings, write=write)
        if not location.key.endswith("/") and location.store.size(location.key) is not None:
            files.append(location)
            continue
        folder = location.key.rstrip("/") + "/"
        found = sorted(
            key
            for key in location.store.keys(folder)
            if not key.rsplit("/", 1)[-1].startswith((".", "_"))
        )
        if not found:
            raise LocationRefused(f"{uri}: no such file, nor files under it")
        base = uri.rstrip("/") + "/"
        files += [Location(location.store, key, base + key[len(folder) :]) for key in found]
    return files
