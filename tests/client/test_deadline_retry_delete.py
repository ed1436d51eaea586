"""The clients' `cancel_after`, `retry` and `delete`, against the app in-process (the `api`
fixture of test_against_api.py), and the `Cancel-After` header they send."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.client.fleet import samples
from tests.client.test_against_api import InProcess, api  # noqa: F401  (a fixture, used by name)
from tffleet import Conflict, NotFound
from tffleet.client.plans import cancel_after_headers


@pytest.mark.parametrize(
    ("given", "header"),
    [
        (30, "30"),
        (1.5, "1.5"),
        (0.00001, "0.00001"),
        (timedelta(minutes=5), "300"),
        ("1h30m", "1h30m"),
    ],
)
def test_cancel_after_is_sent_as_seconds_without_an_exponent_or_as_given(
    given: float | str | timedelta, header: str
) -> None:
    assert cancel_after_headers(given) == {"Cancel-After": header}
    assert cancel_after_headers(None) == {}


@pytest.mark.parametrize("given", [0, -1.0, float("nan")])
def test_cancel_after_of_no_time_is_refused_before_sending(given: float) -> None:
    with pytest.raises(ValueError, match="cancel_after"):
        cancel_after_headers(given)


@pytest.mark.anyio
async def test_submit_with_cancel_after_then_retry_and_delete(api: InProcess) -> None:  # noqa: F811
    job = await api.client.submit("double", samples(1), cancel_after="90s")
    assert job.deadline_at is not None
    assert (job.deadline_at - job.created_at).total_seconds() == pytest.approx(90)
    many = await api.client.submit_many("double", [samples(1)] * 2, cancel_after=60)
    assert all(j.deadline_at is not None for j in many)

    with pytest.raises(Conflict) as refused:
        await api.client.retry(job.id)
    assert "is queued" in refused.value.message
    with pytest.raises(Conflict):
        await api.client.delete(job.id)

    await api.client.cancel(job.id)
    again = await api.client.retry(job.id, cancel_after=timedelta(minutes=1))
    assert again.id == job.id and again.status == "queued" and again.error is None
    api.worker.finish([job.id])
    done = await api.client.wait(job.id, timeout=10)
    assert done.ok and done.outputs is not None

    assert await api.client.delete(job.id) is None
    with pytest.raises(NotFound):
        await api.client.get(job.id)
    with pytest.raises(NotFound):
        await api.client.delete(job.id)
