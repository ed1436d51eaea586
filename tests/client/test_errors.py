"""One error tree for the client and the service (`tffleet.errors`): the client raises the very
classes the API raises, an error answer by its status and code, and the 410 of a retry whose
inputs are gone as `InputsGone`, through the sans-IO plans and from the real API."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import delete

import tffleet
from db.engine import make_engine, make_sessionmaker
from db.models import JobInput
from tests.client.fleet import samples
from tests.client.test_against_api import InProcess, api  # noqa: F401  (a fixture, used by name)
from tffleet import errors
from tffleet.client import errors as client_errors
from tffleet.client import plans
from tffleet.client.protocol import Call, Retries


def answer_classes() -> Iterator[type[errors.HTTPStatusError]]:
    """Every error answer of the tree, as `tffleet.errors` defines it."""
    for _, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.HTTPStatusError) and cls is not errors.HTTPStatusError:
            yield cls


def test_the_client_raises_the_kernels_classes_under_one_root() -> None:
    assert tffleet.NotFound is errors.NotFound and tffleet.InputsGone is errors.InputsGone
    assert tffleet.ClientError is errors.TffleetError
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, Exception):
            assert getattr(client_errors, name) is cls, name
    for name in tffleet.__all__:
        value = getattr(tffleet, name)
        if inspect.isclass(value) and issubclass(value, Exception):
            assert issubclass(value, errors.TffleetError), name


def test_every_error_answer_is_found_by_its_status_and_code() -> None:
    classes = list(answer_classes())
    assert len({(cls.status_code, cls.code) for cls in classes}) == len(classes)
    for cls in classes:
        assert errors.class_for(cls.status_code, cls.code) is cls


def test_what_the_api_raises_reads_as_its_message_and_what_a_client_read_as_the_answer() -> None:
    raised = errors.InputsGone("job 'j1': its inputs are no longer stored")
    assert str(raised) == raised.message == "job 'j1': its inputs are no longer stored"
    assert (raised.status_code, raised.code, raised.response) == (410, "inputs_gone", None)
    read = errors.Gone.from_answer(410, "purged", "gone for good")
    assert str(read) == "410 purged: gone for good" and read.message == "gone for good"
    assert (read.status_code, read.code) == (410, "purged") and errors.Gone.code == "gone"


def test_a_410_answer_to_a_retry_raises_inputs_gone_through_the_plan() -> None:
    plan = plans.retry("j1", cancel_after=None, retries=Retries(attempts=3))
    call = next(plan)
    assert isinstance(call, Call) and (call.method, call.path) == ("POST", "/v1/jobs/j1/retry")
    body = {"error": {"code": "inputs_gone", "message": "job 'j1': inputs no longer stored"}}
    with pytest.raises(tffleet.InputsGone) as gone:
        plan.send(httpx.Response(410, json=body))  # not retried: a 410 is an answer
    assert isinstance(gone.value, tffleet.Gone) and isinstance(gone.value, tffleet.ClientError)
    assert gone.value.message == "job 'j1': inputs no longer stored"


@pytest.mark.anyio
async def test_retry_of_a_job_whose_inputs_are_gone_raises_inputs_gone(
    api: InProcess,  # noqa: F811
    sqlite_url: str,
) -> None:
    job = await api.client.submit("double", samples(1))
    await api.client.cancel(job.id)
    engine = make_engine(sqlite_url)
    with make_sessionmaker(engine).begin() as session:  # as a job split by an older tffleet
        session.execute(delete(JobInput).where(JobInput.job_id == job.id))
    engine.dispose()
    with pytest.raises(tffleet.InputsGone) as gone:
        await api.client.retry(job.id)
    assert (gone.value.status_code, gone.value.code) == (410, "inputs_gone")
    assert "no longer stored" in gone.value.message
    assert (await api.client.get(job.id)).status == "canceled"
