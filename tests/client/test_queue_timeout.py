"""The clients' `queue_timeout`, against the app in-process (the `api` fixture of
test_against_api.py), and the `Queue-Timeout` header they send."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from tests.client.fleet import samples
from tests.client.test_against_api import InProcess, api  # noqa: F401  (a fixture, used by name)
from tffleet.client.plans import cancel_after_headers


def test_queue_timeout_is_sent_beside_cancel_after_as_seconds_or_as_given() -> None:
    assert cancel_after_headers(None, 30) == {"Queue-Timeout": "30"}
    assert cancel_after_headers("1h", timedelta(seconds=0.5)) == {
        "Cancel-After": "1h",
        "Queue-Timeout": "0.5",
    }
    assert cancel_after_headers(None, "90s") == {"Queue-Timeout": "90s"}
    with pytest.raises(ValueError, match="queue_timeout"):
        cancel_after_headers(None, 0)


def sent(running: InProcess) -> list[str | None]:
    """The Queue-Timeout header of each submit and retry sent."""
    return [
        r.headers.get("queue-timeout")
        for r in running.transport.requests
        if r.method == "POST" and (r.url.path == "/v1/jobs" or r.url.path.endswith("/retry"))
    ]


@pytest.mark.anyio
async def test_submit_submit_many_and_retry_send_the_queue_timeout(api: InProcess) -> None:  # noqa: F811
    job = await api.client.submit("double", samples(1), queue_timeout="10ms")
    await asyncio.sleep(0.05)
    assert api.worker.finish([job.id]) == []  # the claim cancels it instead
    canceled = await api.client.get(job.id)
    assert canceled.status == "canceled" and canceled.error is not None
    assert canceled.error.code == "queue_timeout" and canceled.attempts == 0

    await api.client.submit_many("double", [samples(1)] * 2, queue_timeout=60)
    again = await api.client.retry(job.id, queue_timeout=timedelta(minutes=5))
    assert again.status == "queued" and again.error is None
    assert api.worker.finish([job.id]) == [job.id]

    assert sent(api) == ["10ms", "60", "300"]
