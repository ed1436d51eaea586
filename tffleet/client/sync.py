"""A Python client of the tffleet HTTP API (contract v1), blocking; `tffleet.client.aio` has its
twin.

    with Client("http://127.0.0.1:8000") as client:
        job = client.submit("example", np.ones((2, 4), np.float32))
        done = client.wait(job.id, timeout=60).raise_for_error()
        done.outputs["output_0"]                      # a NumPy array

    outputs = client.run("example", {"x": batch})   # submit, wait, raise JobFailed or return

    jobs = client.submit_many("example", [x[i : i + 1] for i in range(len(x))])
    done = client.wait_all([job.id for job in jobs])  # a progress bar for many jobs on a TTY

Errors are in `tffleet.client.errors` (root `ClientError`). What each method sends and how it
reads the answers is in `tffleet.client.plans` (`tffleet.client.bulk` for `submit_many`) and
`tffleet.client.protocol`, shared with the async client; this module only performs it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

import httpx
import numpy as np

from tffleet.client import bulk, objects, plans, transforms, waiting
from tffleet.client.events import Follow
from tffleet.client.job import Job, ModelInfo
from tffleet.client.objects import DEFAULT_INLINE_MAX_BYTES
from tffleet.client.protocol import Call, Plan, Retries, build_request, connection
from tffleet.client.transform_handle import TransformHandle
from tffleet.client.transforms import Transform

__all__ = ["Client", "Retries"]

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0  # per request; a long-poll's read timeout adds its wait
DEFAULT_CHUNK_SIZE = 256  # jobs per bulk submit request
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024  # body bytes per bulk submit request (the API takes 64 MiB)


class Client:
    """A blocking client. `transport` replaces the network (an `httpx.MockTransport` in tests).

    `inputs` is a dict of input name to array (sent as a binary envelope, dtype kept) or nested
    lists, or one bare array or list for a model with a single input. Arrays of numbers or bools
    holding `BINARY_BODY_MIN_BYTES` (64 KiB) or more together go as a binary body instead (.npz,
    or .npy for one bare array), and one job's outputs come back from an .npz: the API then
    copies their bytes instead of parsing base64 out of JSON.

    An array of numbers or bools over `inline_max_bytes` (256 KiB, above the API's 8 KiB
    TFFLEET_INLINE_MAX_BYTES; None: never) is uploaded first (`upload`) and the job names it by
    URI, so no big tensor passes through a job's request or the database. Outputs the API holds
    in its object store come in one job's .npz with the others (up to TFFLEET_MAX_BODY_BYTES of
    them); in a JSON answer, as references, which every method that returns a job fetches:
    `Job.outputs` has arrays either way.
    """

    def __init__(
        self,
        url: str | httpx.URL | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_S,
        retries: Retries | None = None,
        transport: httpx.BaseTransport | None = None,
        headers: dict[str, str] | None = None,
        inline_max_bytes: int | None = DEFAULT_INLINE_MAX_BYTES,
    ) -> None:
        self._inline_max_bytes = inline_max_bytes
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._retries = retries or Retries()
        url, headers = connection(url, api_key, headers)
        self._http = httpx.Client(
            base_url=url, timeout=self._timeout, transport=transport, headers=headers
        )

    @property
    def url(self) -> httpx.URL:
        return self._http.base_url

    def submit(
        self,
        model: str,
        inputs: Any,
        *,
        version: int | None = None,
        priority: int = 0,
        idempotency_key: str | None = None,
        cancel_after: float | str | timedelta | None = None,
        queue_timeout: float | str | timedelta | None = None,
        webhook: str | None = None,
        webhook_events: Sequence[str] | None = None,
    ) -> Job:
        """Submit one job (its inputs may hold a batch); returns it `queued`.

        The request carries `idempotency_key` (a fresh one if None), so a retry after a lost
        answer, or a later call with the same key and inputs, gets the same job back (an input
        this call uploads is a new upload each call, another request to the API: upload it
        once and pass `{"uri": ...}` to repeat a keyed submit).
        `cancel_after` (seconds, a timedelta, or "90s", "1h30m"): a job not ended by then is
        canceled, error `deadline`; `queue_timeout` (the same): a job no worker started by then
        is canceled without running, error `queue_timeout`. `webhook`: an http(s) URL that gets
        the job, signed, on `webhook_events` (`start`, `completed`; default `["completed"]`);
        check each delivery with `tffleet.webhooks.verify(client.webhook_secret(), headers,
        body)`.
        """
        return self._drive(
            plans.submit(
                model,
                inputs,
                version=version,
                priority=priority,
                idempotency_key=idempotency_key,
                retries=self._retries,
                cancel_after=cancel_after,
                queue_timeout=queue_timeout,
                webhook=webhook,
                webhook_events=webhook_events,
                inline_max_bytes=self._inline_max_bytes,
            )
        )

    def submit_many(
        self,
        model: str,
        inputs_list: Iterable[Any],
        *,
        version: int | None = None,
        priority: int = 0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        idempotency_key: str | None = None,
        progress: bool | None = False,
        cancel_after: float | str | timedelta | None = None,
        queue_timeout: float | str | timedelta | None = None,
        webhook: str | None = None,
        webhook_events: Sequence[str] | None = None,
    ) -> list[Job]:
        """One job per item of `inputs_list` (each with its batch dimension: `x[i : i + 1]`,
        not `x[i]`), sent in bulk requests of `chunk_size` jobs or `chunk_bytes`; returns the
        jobs in order. A refused request raises with `.submitted`, the jobs stored before it.
        `cancel_after`, `queue_timeout`, `webhook` and `webhook_events` apply to every job, as
        in `submit`."""
        return self._drive(
            bulk.submit_many(
                model,
                inputs_list,
                version=version,
                priority=priority,
                chunk_size=chunk_size,
                chunk_bytes=chunk_bytes,
                idempotency_key=idempotency_key,
                progress=progress,
                retries=self._retries,
                cancel_after=cancel_after,
                queue_timeout=queue_timeout,
                webhook=webhook,
                webhook_events=webhook_events,
                inline_max_bytes=self._inline_max_bytes,
            )
        )

    def upload(
        self, array: np.ndarray | Mapping[str, np.ndarray], *, progress: bool | None = None
    ) -> str:
        """Upload one array to the API's object store (`POST /v1/uploads`, its .npy streamed
        from the array's buffer); returns its URI, to pass as an input: `{"x": {"uri": uri}}`.
        A dict of arrays goes as one .npz (copied once into it): `{"uri": uri}` is then its
        array of the input's name, `{"uri": f"{uri}/{name}"}` any of them.
        An upload is kept for a while (the API's TFFLEET_UPLOAD_TTL_S), for any number of jobs.
        `progress`: a bar; None: for 64 MiB or more when stderr is a terminal."""
        return self._drive(objects.upload(array, retries=self._retries, progress=progress))

    def get(self, job_id: str, *, encoding: str = "b64") -> Job:
        return self._drive(waiting.get(job_id, encoding=encoding, wait_s=0, retries=self._retries))

    def get_many(self, job_ids: Sequence[str], *, encoding: str = "b64") -> list[Job]:
        """Many jobs in bulk status reads, in the order given."""
        return self._drive(
            waiting.get_many(job_ids, encoding=encoding, wait_s=0, retries=self._retries)
        )

    def wait(self, job_id: str, *, timeout: float | None = None) -> Job:
        """The job once it has finished; `WaitTimeout` if `timeout` seconds pass first."""
        return self._drive(waiting.wait(job_id, timeout=timeout, retries=self._retries))

    def wait_all(
        self,
        job_ids: Sequence[str],
        *,
        timeout: float | None = None,
        progress: bool | None = None,
    ) -> list[Job]:
        """Every job once all have finished, in the order given; `WaitTimeout` (with `.jobs`)
        if `timeout` seconds pass first. `progress=None`: a bar for many jobs on a terminal."""
        return self._drive(
            waiting.wait_all(job_ids, timeout=timeout, progress=progress, retries=self._retries)
        )

    def cancel(self, job_id: str) -> Job:
        """Cancel a queued or running job; `Conflict` if it had already finished."""
        return self._drive(plans.cancel(job_id, retries=self._retries))

    def retry(
        self,
        job_id: str,
        *,
        cancel_after: float | str | timedelta | None = None,
        queue_timeout: float | str | timedelta | None = None,
    ) -> Job:
        """Run a failed or canceled job again under its id; returns it `queued`. `Conflict` if
        it is queued, running or succeeded. `cancel_after`, `queue_timeout`: a new deadline and
        queue time-out, as in `submit`."""
        return self._drive(
            plans.retry(
                job_id,
                cancel_after=cancel_after,
                queue_timeout=queue_timeout,
                retries=self._retries,
            )
        )

    def delete(self, job_id: str) -> None:
        """Delete an ended job, its inputs and outputs; `Conflict` while it is queued or running
        (cancel it first), `NotFound` if it is gone already."""
        self._drive(plans.delete(job_id, retries=self._retries))

    def events(self, job_id: str, *, encoding: str = "b64") -> Iterator[Job]:
        """The job now, then at each change of its status, until it has ended (the last one
        with its outputs): the API's event stream, opened again where the connection drops,
        with `Last-Event-ID`, so no state comes twice."""
        follow = Follow(job_id, encoding=encoding, retries=self._retries)
        timeout = follow.timeout(self._timeout)
        while not follow.ended:
            call = follow.call()
            request = build_request(self._http, call, timeout)
            try:
                response = self._http.send(request, stream=True)
                try:
                    if response.status_code != 200:
                        response.read()
                    if follow.opened(response):
                        for line in response.iter_lines():
                            if (job := follow.line(line)) is not None:
                                yield self._drive(objects.fetch_outputs(job, retries=self._retries))
                finally:
                    response.close()
            except httpx.RequestError as exc:
                time.sleep(follow.dropped(exc, call))
                continue
            if not follow.ended:
                time.sleep(follow.dropped(None, call))

    def transform(
        self,
        model: str,
        input: str | Sequence[str],
        output: str | None = None,
        *,
        format: str | None = None,
        input_format: str | None = None,
        columns: Mapping[str, str] | None = None,
        key: str | None = None,
        version: int | None = None,
        shard_records: int | None = None,
        priority: int | None = None,
        webhook: str | None = None,
        webhook_events: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> TransformHandle:
        """Run `model` over every record of `input` (a file, a prefix or a list of files:
        `tffleet://datasets/...`, or `file://` and `s3://` under the fleet's
        TFFLEET_TRANSFORM_LOCATIONS), its output parts written under `output` (default
        `tffleet://transforms/<id>/`) in `format` (parquet, jsonl, npy). `columns` maps each
        model input to its column (default: the same names), `key` names a column carried to
        the output (else the record's index); `input_format` is said by the files' names
        unless given. Returns a handle: `.wait(progress=True)`, `.read()`, `.errors()`. The
        API checks the files against the model's signature first: 422 naming the column."""
        body = transforms.transform_body(
            model,
            input,
            output,
            format=format,
            input_format=input_format,
            columns=columns,
            key=key,
            version=version,
            shard_records=shard_records,
            priority=priority,
            webhook=webhook,
            webhook_events=webhook_events,
        )
        plan = transforms.create(body, idempotency_key=idempotency_key, retries=self._retries)
        return TransformHandle(self, self._drive(plan))

    def get_transform(self, transform_id: str) -> TransformHandle:
        """A handle on a transform made before (by id), as it is now."""
        plan = transforms.get(transform_id, wait_s=0, retries=self._retries)
        return TransformHandle(self, self._drive(plan))

    def transforms(
        self, *, status: str | None = None, model: str | None = None, limit: int = 100
    ) -> list[Transform]:
        """This key's tenant's transforms, newest first (`limit` at most)."""
        plan = transforms.list_transforms(
            status=status, model=model, limit=limit, retries=self._retries
        )
        return self._drive(plan)

    def put_dataset(
        self,
        source: str | os.PathLike[str] | bytes,
        path: str,
        *,
        overwrite: bool = False,
        progress: bool | None = None,
    ) -> str:
        """Put a file (a path, or bytes) into the fleet's store at `tffleet://datasets/<path>`
        for transforms to read; returns that URI. `Conflict` where a file is there already,
        unless `overwrite`. `progress`: a bar (None: for 64 MiB or more on a terminal)."""
        plan = transforms.put_dataset(
            source, path, overwrite=overwrite, progress=progress, retries=self._retries
        )
        return self._drive(plan)

    def webhook_secret(self) -> str:
        """The `whsec_...` secret that signs this key's tenant's webhooks."""
        return self._drive(plans.webhook_secret(retries=self._retries))

    def models(self) -> list[ModelInfo]:
        return self._drive(plans.models(retries=self._retries))

    def run(
        self,
        model: str,
        inputs: Any,
        *,
        version: int | None = None,
        priority: int = 0,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Submit, wait, and return the outputs; `JobFailed` if the job did not succeed."""
        return self._drive(
            plans.run(
                model,
                inputs,
                version=version,
                priority=priority,
                timeout=timeout,
                retries=self._retries,
                inline_max_bytes=self._inline_max_bytes,
            )
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _drive(self, plan: Plan[T]) -> T:
        """Perform what the plan asks, one step at a time, until it returns."""
        try:
            op = next(plan)
            while True:
                if isinstance(op, Call):
                    request = build_request(self._http, op, self._timeout)
                    try:
                        response = self._http.send(request)
                    except httpx.RequestError as exc:
                        op = plan.throw(exc)
                        continue
                    op = plan.send(response)
                else:
                    time.sleep(op.seconds)
                    op = plan.send(None)
        except StopIteration as stop:
            result: T = stop.value
            return result
        finally:
            plan.close()
