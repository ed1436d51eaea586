"""An object streamed back from the store as a download (a job's output, a transform's file).

Its first chunk is read before the answer starts, so a missing object is a 410 and a store that
does not answer a 503, not a broken 200. A store that fails later cuts the answer short of its
Content-Length: the client sees a broken transfer, never a short file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from tffleet.errors import OutputsGone
from tffleet.objectstore import ObjectMissing, ObjectStore


async def download(
    store: ObjectStore, key: str, *, size: int, media_type: str, filename: str, gone: str
) -> StreamingResponse:
    """The object at `key` (`size` bytes) as an attachment named `filename`; `gone`: the
    410's message, for an object no longer in the store."""
    chunks = store.stream_async(key)
    try:
        first = await anext(chunks)
    except ObjectMissing:
        raise OutputsGone(gone) from None
    except StopAsyncIteration:
        first = b""

    async def body() -> AsyncIterator[bytes]:
        yield first
        async for chunk in chunks:
            yield chunk

    return StreamingResponse(
        body(),
        media_type=media_type,
        headers={
            "Content-Length": str(size),
            "Content-Disposition": f'attachment; filename="{filename}"',
        },
    )
