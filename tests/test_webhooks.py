"""tffleet.webhooks: signatures as the reference Standard Webhooks library makes and checks
them, the client's `verify`, and which addresses a webhook may not reach."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest
import standardwebhooks

from tffleet import webhooks

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
BODY = b'{"id":"job-1","status":"succeeded"}'


def test_our_signature_verifies_with_the_reference_library() -> None:
    headers = webhooks.headers(SECRET, "msg_1", BODY)
    assert standardwebhooks.Webhook(SECRET).verify(BODY, headers) == {
        "id": "job-1",
        "status": "succeeded",
    }


def test_verify_accepts_the_reference_librarys_signature() -> None:
    now = int(time.time())
    signed = standardwebhooks.Webhook(SECRET).sign("msg_2", _dt(now), BODY.decode())
    headers = {"Webhook-Id": "msg_2", "Webhook-Timestamp": str(now), "Webhook-Signature": signed}
    assert webhooks.verify(SECRET, headers, BODY)["id"] == "job-1"


def _dt(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


@pytest.mark.parametrize(
    "change",
    ["body", "secret", "id", "old", "future", "missing"],
)
def test_verify_refuses_a_bad_signature_or_an_old_timestamp(change: str) -> None:
    headers = webhooks.headers(SECRET, "msg_3", BODY)
    body, secret = BODY, SECRET
    if change == "body":
        body = BODY.replace(b"succeeded", b"failed")
    elif change == "secret":
        secret = "whsec_" + base64.b64encode(b"x" * 32).decode()
    elif change == "id":
        headers["webhook-id"] = "msg_4"
    elif change in ("old", "future"):
        shift = -301 if change == "old" else 301
        headers = webhooks.headers(SECRET, "msg_3", BODY, now=time.time() + shift)
    else:
        del headers["webhook-signature"]
    with pytest.raises(webhooks.WebhookVerificationError):
        webhooks.verify(secret, headers, body)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "::1",
        "fe80::1",
        "fc00::1",
        "::",
        "ff02::1",
        "::ffff:127.0.0.1",
    ],
)
def test_addresses_the_fleet_must_not_reach(address: str) -> None:
    assert webhooks.forbidden(address) is not None
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(webhooks.WebhookAddressError):
        webhooks.check(f"http://{host}/hook", allow_private=False)
    assert webhooks.check(f"http://{host}/hook", allow_private=True)


def test_public_addresses_and_names_that_resolve_to_loopback() -> None:
    assert webhooks.forbidden("93.184.216.34") is None
    assert webhooks.forbidden("2606:2800:220:1:248:1893:25c8:1946") is None
    with pytest.raises(webhooks.WebhookAddressError, match="loopback"):
        webhooks.check("http://localhost:8080/hook", allow_private=False)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "http:///nohost",
        "not a url",
        "http://user:pw@example.com/",
        "x" * 3000,
    ],
)
def test_malformed_urls(url: str) -> None:
    with pytest.raises(webhooks.WebhookAddressError):
        webhooks.parse_url(url)
