"""Webhooks as Standard Webhooks (https://www.standardwebhooks.com) signs them, and which
addresses a webhook may reach.

Every delivery carries three headers: `webhook-id` (the same on every attempt of one delivery:
a receiver drops repeats by it), `webhook-timestamp` (unix seconds of this attempt) and
`webhook-signature`: `v1,` and the base64 of HMAC-SHA256 over `{id}.{timestamp}.{body}`, keyed
with the base64-decoded part of the tenant's `whsec_...` secret (GET /v1/webhooks/secret).

A receiver checks one with `verify`:

    from tffleet.webhooks import verify
    job = verify(secret, request.headers, request.body)  # raises WebhookVerificationError
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import socket
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

SECRET_PREFIX = "whsec_"
# A signature older (or newer) than this is refused: a replayed delivery of long ago.
TOLERANCE_S = 5 * 60


class WebhookVerificationError(Exception):
    """A webhook whose signature does not match, whose headers are missing, or whose timestamp
    is more than five minutes from now."""


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header of one attempt."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, msg_id: str, body: bytes, *, now: float | None = None) -> dict[str, str]:
    timestamp = int(time.time() if now is None else now)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
        "content-type": "application/json",
    }


def verify(
    secret: str, headers: Mapping[str, str], body: bytes | str, *, now: float | None = None
) -> Any:
    """The delivered job (the JSON body, parsed) if the headers sign `body` with `secret`;
    else `WebhookVerificationError`. Header names in any case."""
    lower = {name.lower(): value for name, value in headers.items()}
    try:
        msg_id = lower["webhook-id"]
        stamp = lower["webhook-timestamp"]
        given = lower["webhook-signature"]
    except KeyError as exc:
        raise WebhookVerificationError(f"missing header {exc.args[0]}") from None
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError(f"webhook-timestamp: not unix seconds: {stamp!r}") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > TOLERANCE_S:
        raise WebhookVerificationError(
            f"webhook-timestamp {timestamp} is more than {TOLERANCE_S} s from now ({current:.0f})"
        )
    data = body.encode() if isinstance(body, str) else body
    expected = sign(secret, msg_id, timestamp, data).encode()
    # The header may list several signatures (space-separated), during a secret's rotation.
    if not any(hmac.compare_digest(expected, part.encode()) for part in given.split()):
        raise WebhookVerificationError("no signature matches (wrong secret, or a changed body)")
    return orjson.loads(data)


# ─── Where a webhook may go ───────────────────────────────────────────────────────────────────────


class WebhookAddressError(ValueError):
    """A webhook URL that is malformed, or whose host is (or resolves to) an address the fleet
    must not reach: loopback, private, link-local, unique-local, multicast, unspecified,
    reserved."""


MAX_URL_LENGTH = 2000


def parse_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL with a host; else `WebhookAddressError`."""
    if len(url) > MAX_URL_LENGTH:
        raise WebhookAddressError(f"longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookAddressError(f"not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookAddressError("must be an http:// or https:// URL")
    if not parts.hostname:
        raise WebhookAddressError("must name a host")
    if parts.username or parts.password:
        raise WebhookAddressError("must not carry a user or password")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def forbidden(address: str) -> str | None:
    """Why the fleet must not reach `address` (an IP), or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for name in (
        "is_loopback",
        "is_private",
        "is_link_local",
        "is_multicast",
        "is_unspecified",
        "is_reserved",
    ):
        if getattr(ip, name):
            return f"{ip} is {name.removeprefix('is_').replace('_', '-')}"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return f"{ip} is site-local"
    if not ip.is_global:
        return f"{ip} is not a global address"
    return None


def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to now (an IP literal: itself)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise WebhookAddressError(f"host {host!r} does not resolve ({exc})") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def check(url: str, *, allow_private: bool) -> list[str]:
    """The addresses a webhook to `url` may connect to now; `WebhookAddressError` if any
    address its host resolves to is forbidden (unless `allow_private`)."""
    _, host, port = parse_url(url)
    addresses = resolve(host, port)
    if not allow_private:
        for address in addresses:
            why = forbidden(address)
            if why:
                raise WebhookAddressError(f"host {host!r} is not reachable from the fleet: {why}")
    return addresses
