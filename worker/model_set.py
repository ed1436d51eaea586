"""The model versions one worker child holds, kept in step with the repository on disk.

`refresh()` rescans the repository (every TFFLEET_MODEL_POLL_S, and at once on `tffleet models
reload`). For each model this child serves (the worker's models whose model.toml `devices`
include this child's device) it

1. loads and warms up the versions the `versions` policy asks for that it does not hold yet,
   puts each into `models` (where the task thread finds it), and only then registers its
   signature and reports it loaded: a version becomes "latest" for the API once it can run;
2. retires the held versions that the policy no longer serves (under "latest": once a newer one
   is loaded, never before), so the API refuses new jobs naming them, and drains them: they
   still run their jobs;
3. unloads a draining version once no job of it is queued or running, and not before
   `drain_grace_s`: an API trusts its cached view of the models for one poll, and a submission
   resolved just before that lapsed may still be committing.

A model that appears after the child started (a new directory in the repository) is loaded like
any other, logged ("serving new model"), and its queue consumed (`consume`, before its signature
is registered): the worker's queues are otherwise those of the models there at its start.

A version that fails to load is reported `failed` and tried again when its files change (a copy
still in progress) or on `tffleet models reload`; each distinct error is logged once.

What it holds (`held`, worker/holdings.py) is reported to the database (`db.presence`) on every
change and every poll; the worker/watcher.py threads call `refresh` and `held.report_quietly`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, presence, registry
from db.clock import utcnow
from db.models import PresenceState
from worker.busy import BusyMeter
from worker.holdings import Held, Holdings, Key, describe
from worker.pipeline import BatchPolicy
from worker.repository import ModelConfig, ModelSpec, scan

log = logging.getLogger(__name__)

# A version waits at least this long after it was retired before it is unloaded, however short
# the poll: a submission resolved against an API's cached view still has to commit.
DRAIN_GRACE_MIN_S = 5.0
# At most this many queued jobs of a version are woken when a child loads it (the sweeper wakes
# the rest).
WAKE_LIMIT_JOBS = 4096


@dataclass
class LoadedModel:
    spec: ModelSpec
    runner: Any
    policy: BatchPolicy


def _files(path: Path) -> tuple[tuple[str, int, int], ...]:
    """Name, size and modification time of every file under `path`: changes while a copy runs."""
    found = []
    for file in sorted(path.rglob("*")):
        try:
            if file.is_file():
                stat = file.stat()
                found.append((str(file.relative_to(path)), stat.st_size, stat.st_mtime_ns))
        except OSError:  # removed while we looked
            continue
    return tuple(found)


def _chunks(ids: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


class ModelSet:
    """See the module docstring. `models` is read by the task thread (through `use`); every
    other method runs in the child's watcher threads, or in `init` before any task."""

    def __init__(
        self,
        *,
        repository: Path,
        defaults: ModelConfig,
        child: presence.Child,
        sessions: sessionmaker[Session],
        load: Callable[[ModelSpec], Any],
        wake: Callable[[str, int, Sequence[str]], object],
        poll_s: float,
        names: Collection[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        busy: BusyMeter | None = None,
        consume: Callable[[str], object] | None = None,
    ) -> None:
        self.repository = repository
        self.defaults = defaults
        self.child = child
        self.sessions = sessions
        self._load_runtime = load
        self._wake = wake
        self.poll_s = poll_s
        self.drain_grace_s = max(2 * poll_s, DRAIN_GRACE_MIN_S)
        self._names = None if names is None else frozenset(names)
        self._clock = clock
        # The device's busy share per version, reported with each holding (the task thread adds).
        self.busy = busy or BusyMeter(clock=clock)
        self.held = Holdings(child=child, sessions=sessions, busy=self.busy)
        self.models: dict[Key, LoadedModel] = {}
        # Held by the task thread while it runs a batch, and to unload a version: a version is
        # never closed under a running batch.
        self._in_use = threading.Lock()
        self._logged: dict[Key, str] = {}
        self._consume = consume
        # The models on disk at the first refresh, whose queues the worker consumes from its
        # start; None until then. A model loaded later and not among them is a new one.
        self._known: set[str] | None = None

    # The task thread's side

    @contextmanager
    def use(self, key: Key) -> Iterator[LoadedModel | None]:
        """The loaded version, kept loaded while the block runs; None if this child lacks it."""
        with self._in_use:
            yield self.models.get(key)

    def failure(self, key: Key) -> str | None:
        """Why this child could not load the version, if it tried and failed."""
        return self.held.failure(key)

    # The repository's side

    def refresh(self, *, retry: bool = False, wake: bool = True) -> None:
        """Bring what this child holds in line with the repository (see the module docstring).

        `retry`: load again the versions that failed, changed or not. `wake`: publish wake-ups
        for the queued jobs of each version it loads (whose messages may have come and gone
        while no child held it).
        """
        problems: dict[Path, str] = {}
        specs = scan(self.repository, defaults=self.defaults, problems=problems)
        by_model: dict[str, dict[int, ModelSpec]] = {}
        for spec in specs:
            if self._names is None or spec.name in self._names:
                by_model.setdefault(spec.name, {})[spec.version] = spec
        unreadable = self._note_problems(problems)
        if self._known is None:
            self._known = set(by_model)
        wanted: set[Key] = set()
        kept: dict[str, set[int]] = {}
        for name, on_disk in by_model.items():
            config = next(iter(on_disk.values())).config
            if not config.serves_device(self.child.device):
                continue
            for version in config.served_versions(on_disk):
                wanted.add((name, version))
                if (name, version) not in self.models:
                    self._load(on_disk[version], retry=retry, wake=wake)
            held = [v for n, v in self.models if n == name]
            kept[name] = set(config.served_versions(v for v in held if v in on_disk))
        self._retire(kept, unreadable)
        self._forget_failures(wanted, problems)
        self._unload_drained()
        if self.held.changed:
            self.held.report_quietly()

    def _note_problems(self, problems: dict[Path, str]) -> set[str]:
        """Record unreadable models and versions as failed; the names of unreadable models."""
        unreadable = set()
        for path, why in problems.items():
            if path.parent == self.repository:  # the model's own config
                key = (path.name, 0)
                unreadable.add(path.name)
            else:
                key = (path.parent.name, int(path.name))
            if self._names is not None and key[0] not in self._names:
                continue
            if key not in self.models:  # a loaded one is drained instead: gone from disk
                self._fail(key, path, why, files=None)
        return unreadable

    def _fail(self, key: Key, path: Path, error: str, *, files: Any) -> None:
        before = self.held.get(key)
        since = before.since if before is not None and before.error == error else utcnow()
        self.held.set(key, Held(PresenceState.FAILED, path, since, error=error, files=files))
        if self._logged.get(key) != error:
            self._logged[key] = error
            what = f"{key[0]}:{key[1]} from {path}" if key[1] else key[0]
            log.error("child %s cannot load %s: %s", self.child.device, what, error)

    def _forget_failures(self, wanted: set[Key], problems: dict[Path, str]) -> None:
        """Drop the failures of versions that are fixed, gone, or no longer wanted here."""
        for key, held in self.held.in_state(PresenceState.FAILED).items():
            if held.path not in problems and key not in wanted:
                self.held.set(key, None)
                self._logged.pop(key, None)

    def _load(self, spec: ModelSpec, *, retry: bool, wake: bool) -> None:
        key = (spec.name, spec.version)
        files = _files(spec.path)
        before = self.held.get(key)
        if (
            before is not None
            and before.state == PresenceState.FAILED
            and before.files == files
            and not retry
        ):
            return
        self.held.set(key, Held(PresenceState.LOADING, spec.path, utcnow()))
        self.held.report_quietly()
        started = time.perf_counter()
        try:
            runner = self._load_runtime(spec)
            loaded_s = time.perf_counter() - started
            warm_s = runner.warm_up(spec.config.bucket_sizes())
        except Exception as exc:
            log.debug("loading %s failed", spec.path, exc_info=True)
            self._fail(key, spec.path, describe(exc), files=files)
            return
        policy = BatchPolicy(
            max_batch_size=spec.config.max_batch_size,
            max_queue_delay_ms=spec.config.max_queue_delay_ms,
            buckets=spec.config.bucket_sizes(),
            timeout_s=spec.config.timeout_s,
        )
        new = self._known is not None and spec.name not in self._known
        if new and self._consume is not None:
            try:
                # Before it is registered: the API accepts its jobs from then on.
                self._consume(spec.name)
            except Exception as exc:
                self._fail(
                    key, spec.path, f"could not consume its queue: {describe(exc)}", files=None
                )
                return
        self.models[key] = LoadedModel(spec=spec, runner=runner, policy=policy)
        self.held.set(key, Held(PresenceState.LOADED, spec.path, utcnow()))

        def register(session: Session) -> None:
            registry.register(
                session=session,
                name=spec.name,
                version=spec.version,
                format=runner.format,
                inputs=runner.inputs,
                outputs=runner.outputs,
                config=spec.config.as_dict(),
            )

        try:
            self.held.report(register)
        except SQLAlchemyError as exc:
            # Unregistered, it could take no job: give it up, and load it again next poll.
            self._unload(key)
            self._fail(key, spec.path, f"could not register it: {describe(exc)}", files=None)
            return
        self._logged.pop(key, None)
        if new and self._known is not None:
            self._known.add(spec.name)
            log.info("serving new model %s:%s", spec.name, spec.version)
        log.info(
            "child %s (pid %d, CUDA_VISIBLE_DEVICES=%s) loaded %s:%s in %.2fs, "
            "warmed %d buckets in %.2fs",
            self.child.device, os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            spec.name, spec.version, loaded_s, len(policy.buckets), warm_s,
        )  # fmt: skip
        if wake:
            self._wake_queued(key, policy.max_batch_size)

    def _wake_queued(self, key: Key, per_message: int) -> None:
        try:
            with self.sessions() as session:
                ids = jobs.queued_ids(
                    session=session, model=key[0], version=key[1], limit=WAKE_LIMIT_JOBS
                )
        except SQLAlchemyError as exc:
            log.warning("could not look for queued %s:%s jobs (%s)", *key, describe(exc))
            return
        for chunk in _chunks(ids, per_message):
            self._wake(key[0], key[1], chunk)

    def _retire(self, kept: dict[str, set[int]], unreadable: set[str]) -> None:
        """Drain the held versions that are no longer served here; retire those the policy
        dropped; take back draining ones that are served again."""
        retire: list[Key] = []
        reinstate: list[Key] = []
        before: dict[Key, Held] = {}
        gone: set[str] = set()
        for key in list(self.models):
            name, version = key
            held = before[key] = self.held[key]
            if name in unreadable:
                continue  # a model.toml being edited: change nothing until it parses
            if version in kept.get(name, ()):
                if held.state == PresenceState.DRAINING:
                    reinstate.append(key)
                    served = replace(held, state=PresenceState.LOADED, draining_since=None)
                    self.held.set(key, served)
                continue
            if held.state == PresenceState.DRAINING:
                continue
            # Served elsewhere by the same policy (another device) or not at all: only a policy
            # that dropped it retires it for the whole fleet.
            if name in kept:
                retire.append(key)
            self.held.set(
                key,
                replace(
                    held,
                    state=PresenceState.DRAINING,
                    since=utcnow(),
                    draining_since=self._clock(),
                ),
            )
            newer = sorted(kept.get(name, ()))
            log.info(
                "child %s drains %s:%s (%s); it is unloaded once its jobs are done",
                self.child.device, name, version,
                f"{name}:{newer[-1]} replaces it" if newer else "no longer served here",
            )  # fmt: skip
            if name not in kept and name not in gone:  # its directory left the repository
                gone.add(name)
                log.info("`tffleet models unregister %s` takes %s off the fleet's list once no "
                         "host serves it", name, name)  # fmt: skip
        if not retire and not reinstate:
            return

        def change(session: Session) -> None:
            for name, version in retire:
                registry.retire(session=session, name=name, version=version)
            for name, version in reinstate:
                registry.reinstate(session=session, name=name, version=version)

        try:
            self.held.report(change)
        except SQLAlchemyError as exc:
            log.warning("could not record retired versions (%s); next poll", describe(exc))
            for key, held in before.items():  # as it was, so the next poll does it all again
                self.held.set(key, held)

    def _unload_drained(self) -> None:
        now = self._clock()
        draining = [
            key
            for key, held in self.held.in_state(PresenceState.DRAINING).items()
            if held.draining_since is not None and now - held.draining_since >= self.drain_grace_s
        ]
        for key in draining:
            # Under the task thread's lock: a batch that could still claim a job of it runs
            # first (then the check sees its jobs), or finds the version gone.
            if not self._in_use.acquire(timeout=self.poll_s):
                continue
            try:
                with self.sessions() as session:
                    if jobs.has_unfinished(session=session, model=key[0], version=key[1]):
                        continue
                loaded = self.models.pop(key)
            except SQLAlchemyError as exc:
                log.warning("could not check whether %s:%s drained (%s)", *key, describe(exc))
                continue
            finally:
                self._in_use.release()
            self.held.set(key, None)
            self._close(loaded)
            log.info("child %s unloaded %s:%s: drained", self.child.device, *key)

    def _unload(self, key: Key) -> None:
        with self._in_use:
            loaded = self.models.pop(key, None)
        self.held.set(key, None)
        if loaded is not None:
            self._close(loaded)

    @staticmethod
    def _close(loaded: LoadedModel) -> None:
        close = getattr(loaded.runner, "close", None)
        if close is None:
            return
        try:
            close()
        except Exception:
            log.exception("closing %s failed", loaded.spec.path)
