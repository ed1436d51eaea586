"""Tensors by reference (DESIGN §13), as plans both clients drive (see `tffleet.client.protocol`).

An array too big to go inline in a job is uploaded first (`POST /v1/uploads`, its .npy streamed
from the array's own buffer, never copied into one body) and the job names it `{"uri": ...}`;
an output too big for the API to inline comes back as `{"uri", "dtype", "shape"}`, fetched here
(`GET /v1/jobs/{id}/outputs/{name}`, an .npy) so that `Job.outputs` holds arrays either way.

The API's own limit is TFFLEET_INLINE_MAX_BYTES (8 KiB by default), which a client cannot read:
it uses its own, `DEFAULT_INLINE_MAX_BYTES`, unless told otherwise. The two need not agree: an
input over the API's limit that the client sends inline is stored by the API itself, just with
its bytes in the request. The client's is higher (256 KiB): a medium input goes in the job's
own request, one round trip, where an upload first would take two.
"""

from __future__ import annotations

import dataclasses
import io
import sys
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import numpy as np
from tqdm import tqdm

from tffleet import tensors
from tffleet.client.errors import HTTPStatusError, ProtocolError
from tffleet.client.job import Job, OutputRef, is_envelope
from tffleet.client.protocol import Call, Plan, Retries, Stream, send

# Arrays over this are uploaded before their job (see above; the API's own limit is lower).
DEFAULT_INLINE_MAX_BYTES = 256 * 1024
# Uploads of at least this many bytes together show a progress bar (when stderr is a terminal).
PROGRESS_MIN_BYTES = 64 * 1024 * 1024
# What one chunk of an upload holds: a slice of the array's buffer, sent as it is.
CHUNK_BYTES = 1024 * 1024


def upload(
    arrays: np.ndarray | Mapping[str, np.ndarray],
    *,
    retries: Retries,
    progress: bool | None = None,
) -> Plan[str]:
    """`POST /v1/uploads` of one array (an .npy), or of named arrays (an .npz, what np.savez
    writes: a job names each as `<uri>/<name>`, or by the URI for an input of its name);
    returns its `tffleet://uploads/<id>` URI."""
    if isinstance(arrays, Mapping):
        return (yield from _upload_npz(arrays, retries, progress))
    with _upload_bar(progress, arrays.nbytes) as bar:
        return (yield from _upload(arrays, retries, bar))


def upload_large(
    inputs: Any,
    *,
    inline_max_bytes: int | None,
    retries: Retries,
    progress: bool | None = None,
) -> Plan[Any]:
    """`inputs` by name with each NumPy array of numbers or bools over `inline_max_bytes`
    uploaded and replaced by `{"uri": ...}`; the rest as given. None: nothing is uploaded.

    A bare array (a single-input model's) is not: it goes as an .npy body, which the API
    streams into its store itself where it is large, as an upload would be."""
    if inline_max_bytes is None or not isinstance(inputs, Mapping) or is_envelope(inputs):
        return inputs
    large = {
        name: value
        for name, value in inputs.items()
        if isinstance(value, np.ndarray)
        and value.dtype.name in tensors.DTYPES
        and value.nbytes > inline_max_bytes
    }
    if not large:
        return inputs
    uploaded = dict(inputs)
    with _upload_bar(progress, sum(a.nbytes for a in large.values())) as bar:
        for name, array in large.items():
            try:
                uploaded[name] = {"uri": (yield from _upload(array, retries, bar))}
            except HTTPStatusError as exc:
                if not _no_uploads(exc):
                    raise
                return inputs  # an API from before uploads: the arrays go inline, as they did
    return uploaded


def _no_uploads(exc: HTTPStatusError) -> bool:
    """Whether an upload's error says the API has no upload route (one from before them): the
    framework's own 404 or 405, not one of the API's answers."""
    return exc.status_code in (404, 405) and exc.code == "http_error"


def _upload(array: np.ndarray, retries: Retries, bar: tqdm[Any]) -> Plan[str]:
    body = _npy_stream(array, bar)
    call = Call("POST", "/v1/uploads", headers={"Content-Type": tensors.NPY}, stream=body)
    return (yield from _uploaded(call, retries))


def _upload_npz(
    arrays: Mapping[str, np.ndarray], retries: Retries, progress: bool | None
) -> Plan[str]:
    """The arrays as one .npz body (`tensors.write_npz`: their bytes copied once into it, each
    64-byte aligned), sent in slices as an .npy is."""
    data = memoryview(tensors.write_npz(arrays))
    with _upload_bar(progress, len(data)) as bar:

        def chunks() -> Iterator[bytes | memoryview]:
            bar.reset(total=len(data))  # a try after a failed one counts again
            for at in range(0, len(data), CHUNK_BYTES):
                piece = data[at : at + CHUNK_BYTES]
                yield piece
                bar.update(len(piece))

        body = Stream(length=len(data), chunks=chunks)
        call = Call("POST", "/v1/uploads", headers={"Content-Type": tensors.NPZ}, stream=body)
        return (yield from _uploaded(call, retries))


def _uploaded(call: Call, retries: Retries) -> Plan[str]:
    answer = yield from send(call, retries)
    try:
        return str(answer["uri"])
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"not an upload: {exc!r} in {str(answer)[:200]}") from None


def _npy_stream(array: np.ndarray, bar: tqdm[Any]) -> Stream:
    """`array` as an .npy body: its header, then its own bytes in slices of `CHUNK_BYTES`. Only
    an array that is not C-ordered little-endian already is copied (once), to be so."""
    data = array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(data))
    header = head.getvalue()
    raw = data.reshape(-1).view(np.uint8).data  # its bytes, not copied
    start = bar.n

    def chunks() -> Iterator[bytes | memoryview]:
        bar.n = start  # a try after a failed one starts the count where this array's began
        bar.refresh()
        yield header
        for at in range(0, len(raw), CHUNK_BYTES):
            piece = raw[at : at + CHUNK_BYTES]
            yield piece
            bar.update(len(piece))

    return Stream(length=len(header) + len(raw), chunks=chunks)


def _upload_bar(progress: bool | None, total: int) -> tqdm[Any]:
    """`progress` True or False; None: shown for `PROGRESS_MIN_BYTES` or more on a terminal."""
    if progress is None:
        progress = total >= PROGRESS_MIN_BYTES and sys.stderr.isatty()
    return tqdm(
        total=total,
        desc="upload",
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not progress,
        dynamic_ncols=True,
    )


def read_job(data: Any, *, retries: Retries) -> Plan[Job]:
    """A job off the wire with its outputs fetched where the API gave them by reference."""
    return (yield from fetch_outputs(Job.from_wire(data), retries=retries))


def fetch_outputs(job: Job, *, retries: Retries) -> Plan[Job]:
    """`job` with every output the API gave by reference (`job.references`) fetched as an
    array into `job.outputs`, in the order the API listed them."""
    if not job.references:
        return job
    fetched: dict[str, np.ndarray] = {}
    for name, ref in job.references.items():
        fetched[name] = yield from fetch_output(job.id, name, ref, retries=retries)
    outputs = {**(job.outputs or {}), **fetched}
    return dataclasses.replace(job, outputs=outputs)


def fetch_output(job_id: str, name: str, ref: OutputRef, *, retries: Retries) -> Plan[np.ndarray]:
    """`GET /v1/jobs/{id}/outputs/{name}`: one output as an .npy, checked against what the
    job said of it."""
    path = f"/v1/jobs/{quote(job_id, safe='')}/outputs/{quote(name, safe='')}"
    array = yield from send(Call("GET", path, headers={"Accept": tensors.NPY}), retries)
    if not isinstance(array, np.ndarray):
        raise ProtocolError(f"output {name!r} of job {job_id}: the answer is not an .npy")
    if array.dtype.name != ref.dtype or list(array.shape) != list(ref.shape):
        raise ProtocolError(
            f"output {name!r} of job {job_id}: got {array.dtype.name} {list(array.shape)}, the "
            f"job said {ref.dtype} {list(ref.shape)}"
        )
    return array
