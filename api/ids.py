"""A job's id as the routes take it from their path: `JobId`.

Every route that names a job by id in its path takes a `JobId`, so that each refuses the same
ids the same way: one far longer than any job id is 422 before any query, and one holding NUL
is 404, as an unknown id is, before any query (PostgreSQL refuses NUL in a query, and no job's
id has one).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path
from pydantic import AfterValidator

from tffleet.errors import JobNotFound

# A job id is a UUID (36 characters); anything far longer names no job.
JOB_ID_MAX_LENGTH = 64


def _no_nul(job_id: str) -> str:
    # Raised, not a ValueError: pydantic passes it on as it is, so the answer is the 404 of an
    # unknown job rather than a 422.
    if "\x00" in job_id:
        raise JobNotFound(f"job {job_id!r} not found")
    return job_id


JobId = Annotated[str, Path(max_length=JOB_ID_MAX_LENGTH), AfterValidator(_no_nul)]
