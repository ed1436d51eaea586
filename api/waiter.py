"""Long-polls woken by the workers: one Redis pub/sub subscription per API process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator

from tffleet import announcements
from tffleet.announcements import EndedJob
from tffleet.constants import JOBS_DONE_CHANNEL
from tffleet.redis_urls import async_redis_client

log = logging.getLogger(__name__)


class CompletionWaiter:
    """Resolves a waiter when a worker announces that its job ended.

    A lost announcement (Redis restarting, say) only delays a poll: callers re-read the database
    whenever they wake, and wake at least every `recheck_s`.

    Announcements of the last `remember_s` are remembered, so a caller that starts watching a
    job just after it ended (a submit that waits, watching once its jobs are published) is
    woken at once instead of missing it. A job announced whole while someone watched it is kept
    whole (`ended`) until the last watch of it ends: its watchers need no read.
    """

    recheck_s = 2.0
    remember_s = 30.0
    _REMEMBER_MAX = 100_000

    # How often to try again to read the announcement key while the database does not answer.
    key_retry_s = 10.0

    def __init__(self, redis_url: str, key: Callable[[], bytes] | None = None) -> None:
        self._url = redis_url
        # Reads the key that signs announcements (db.secrets); until it has, every announcement
        # is taken for ids only and its watchers read the database.
        self._read_key = key
        self.key: bytes | None = None
        self._key_tried_at = -float("inf")
        self._waiters: defaultdict[str, set[asyncio.Event]] = defaultdict(set)
        # job id -> (when announced, the job as announced while it was watched)
        self._recent: OrderedDict[str, tuple[float, EndedJob | None]] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self.watches = 0  # requests holding a watch now
        self.losses = 0  # times the channel was lost: what was announced meanwhile is not known

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="completion-waiter")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        # Cancel until it is really done: redis-py sends commands under asyncio.wait_for, which on
        # Python 3.11 swallows a cancellation that lands just as the send completes (the task then
        # goes on to listen forever, and shutdown hangs).
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    @contextlib.contextmanager
    def watch(self, *job_ids: str) -> Iterator[asyncio.Event]:
        """Register interest before reading the database, so no announcement slips between.

        The event is set when any of `job_ids` is announced.
        """
        event = asyncio.Event()
        for job_id in job_ids:
            self._waiters[job_id].add(event)
            if job_id in self._recent:
                event.set()
        self.watches += 1
        try:
            yield event
        finally:
            self.watches -= 1
            for job_id in job_ids:
                waiting = self._waiters.get(job_id)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiters[job_id]
                        self._forget_whole(job_id)

    def announced(self, job_id: str) -> bool:
        """Whether the job's end was announced lately (whole or by its id)."""
        return job_id in self._recent

    def ended(self, job_id: str) -> EndedJob | None:
        """The job as its worker announced it when it ended, if it was announced whole lately."""
        hit = self._recent.get(job_id)
        return hit[1] if hit is not None else None

    def _forget_whole(self, job_id: str) -> None:
        """Keep only that it ended: outputs are held for the watchers of a job, not for 30 s."""
        hit = self._recent.get(job_id)
        if hit is not None and hit[1] is not None:
            self._recent[job_id] = (hit[0], None)

    def _wake(self, ended: list[tuple[str, EndedJob | None]]) -> None:
        now = time.monotonic()
        recent = self._recent
        for job_id, job in ended:
            recent[job_id] = (now, job)
            recent.move_to_end(job_id)
            for event in self._waiters.get(job_id, ()):
                event.set()
        while recent and (
            len(recent) > self._REMEMBER_MAX
            or next(iter(recent.values()))[0] < now - self.remember_s
        ):
            recent.popitem(last=False)

    def _wake_all(self) -> None:
        self.losses += 1
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def _ensure_key(self) -> None:
        if self.key is not None or self._read_key is None:
            return
        if time.monotonic() - self._key_tried_at < self.key_retry_s:
            return
        self._key_tried_at = time.monotonic()
        try:
            self.key = await asyncio.to_thread(self._read_key)
        except Exception as exc:  # the database is away: announcements stay hints meanwhile
            log.warning("cannot read the announcement key (%s); long-polls read the database", exc)

    async def _listen(self) -> None:
        backoff_s = 0.1
        while True:
            # A hung Redis is found by the health check's PING (a poll re-reads the database
            # meanwhile); a connect gives up quickly.
            client = async_redis_client(
                self._url, socket_connect_timeout=2, health_check_interval=10
            )
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(JOBS_DONE_CHANNEL)
                    backoff_s = 0.1
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            await self._ensure_key()
                            self._wake(
                                announcements.decode(
                                    message["data"], key=self.key, wanted=self._waiters
                                )
                            )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("completion channel lost (%s); reconnecting", exc)
                self._wake_all()  # let every poll re-check the database
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 5.0)
            finally:
                await client.aclose()
