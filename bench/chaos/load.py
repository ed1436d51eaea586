"""The chaos run's load and its history: every acknowledged submit, and every answer.

Several tenants, each with a key of its own, submit at a steady rate from one asyncio loop on a
thread: single jobs, bulk requests of several jobs, split jobs (more samples than a batch holds)
and now and then a transform over an .npy dataset in the store. Each job's inputs come from a
seed of its own (`inputs`), so the checker rebuilds them. A submit that got no answer (the API
killed under it, a refusal) is retried as a new request: only acknowledged ones count. Answers
are polled (`/v1/jobs/status`, per tenant) until every job has ended.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from tests.e2e.models import SLEEP_COLUMN

FINAL = ("succeeded", "failed", "canceled")
BATCH = 8  # the model's max_batch_size: a job of more samples is split into parts
SLEEP_S = 0.05  # each forward pass holds its child this long: a kill finds batches running


def inputs(seed: int, samples: int) -> np.ndarray:
    """A job's inputs, from its seed: `samples` rows of 4 floats."""
    x = np.random.default_rng(seed).normal(size=(samples, 4)).astype(np.float32)
    x[:, SLEEP_COLUMN] = SLEEP_S
    return x


@dataclass
class Submit:
    job_id: str
    tenant: str
    kind: str  # single, bulk, split
    seed: int
    samples: int
    acked_at: float  # time.time()
    status: str = "queued"
    error_code: str | None = None
    created_at: float | None = None
    finished_at: float | None = None  # the API's, as time.time()


@dataclass
class TransformRun:
    transform_id: str
    tenant: str
    seed: int
    records: int
    acked_at: float
    status: str = "queued"
    answer: dict[str, Any] = field(default_factory=dict)


def stamp(value: str | None) -> float | None:
    if not value:
        return None
    from datetime import UTC, datetime

    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


class Load:
    def __init__(
        self,
        url: str,
        keys: dict[str, str],
        *,
        rate: float,
        seed: int,
        put_dataset: Any,
        transform_every_s: float,
    ) -> None:
        self.url, self.keys, self.rate = url, keys, rate
        self.rng = np.random.default_rng(seed)
        self.put_dataset = put_dataset  # (tenant, name, bytes) -> None
        self.transform_every_s = transform_every_s
        self.jobs: dict[str, Submit] = {}
        self.transforms: dict[str, TransformRun] = {}
        self.retried = 0  # requests that got no acknowledgement and were sent again
        self.refusals: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._seeds = 0
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _seed(self) -> int:
        self._seeds += 1
        return self._seeds

    def _client(self, tenant: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.keys[tenant]}"},
            trust_env=False,
            timeout=httpx.Timeout(30, connect=5),
        )

    async def _post(self, client: httpx.AsyncClient, path: str, body: Any) -> Any:
        """POST until acknowledged (202); None once the run stops."""
        while True:
            try:
                r = await client.post(path, json=body)
                if r.status_code == 202:
                    return r.json()
                self.refusals.append(f"{r.status_code} {r.text[:160]}")
            except httpx.HTTPError as exc:
                self.refusals.append(f"{type(exc).__name__}")
            self.retried += 1
            if self._stop.is_set():
                return None
            await asyncio.sleep(0.5)

    async def _submit(self, tenant: str, client: httpx.AsyncClient) -> None:
        roll = self.rng.random()
        if roll < 0.7:
            kind, count, samples = "single", 1, int(self.rng.integers(1, 4))
        elif roll < 0.9:
            count = int(self.rng.integers(3, 9))
            kind, samples = "bulk", int(self.rng.integers(1, 4))
        else:
            kind, count, samples = "split", 1, int(self.rng.integers(3 * BATCH, 5 * BATCH))
        seeds = [self._seed() for _ in range(count)]
        bodies = [{"model": "faulty", "inputs": {"x": inputs(s, samples).tolist()}} for s in seeds]
        if kind == "bulk":
            answer = await self._post(client, "/v1/jobs", {"jobs": bodies})
            ids = [job["id"] for job in answer["jobs"]] if answer else []
        else:
            answer = await self._post(client, "/v1/jobs", bodies[0])
            ids = [answer["id"]] if answer else []
        now = time.time()
        for job_id, s in zip(ids, seeds, strict=True):
            self.jobs[job_id] = Submit(job_id, tenant, kind, s, samples, now)

    async def _transform(self, tenant: str, client: httpx.AsyncClient) -> None:
        seed, records = self._seed(), int(self.rng.integers(40, 120))
        sink = io.BytesIO()
        np.save(sink, inputs(seed, records), allow_pickle=False)
        name = f"chaos/t{seed}.npy"
        await asyncio.to_thread(self.put_dataset, tenant, name, sink.getvalue())
        body = {
            "model": "faulty",
            "input": {"uri": f"tffleet://datasets/{name}"},
            "output": {"format": "npy"},
            "shard_records": 32,
        }
        answer = await self._post(client, "/v1/transforms", body)
        if answer:
            run = TransformRun(answer["id"], tenant, seed, records, time.time())
            self.transforms[run.transform_id] = run

    async def _main(self) -> None:
        try:
            await self._run()
        except BaseException as exc:  # reported by the run
            self.error = exc
            raise

    async def _run(self) -> None:
        clients = {tenant: self._client(tenant) for tenant in self.keys}
        tenants = sorted(self.keys)
        pending: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        sent, next_transform = 0, start + 3
        while not self._stop.is_set():
            tenant = tenants[sent % len(tenants)]
            if time.monotonic() >= next_transform:
                task = asyncio.create_task(self._transform(tenant, clients[tenant]))
                next_transform += self.transform_every_s
            else:
                task = asyncio.create_task(self._submit(tenant, clients[tenant]))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
            await asyncio.sleep(max(0.0, start + sent / self.rate - time.monotonic()))
        await asyncio.gather(*pending)
        for client in clients.values():
            await client.aclose()

    # Answers

    def poll(self, timeout_s: float) -> list[str]:
        """Read every job's and transform's answer until all have ended; the ids that did not."""
        return asyncio.run(self._poll(timeout_s))

    async def _poll(self, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            open_jobs = [j for j in self.jobs.values() if j.status not in FINAL]
            open_runs = [t for t in self.transforms.values() if t.status not in FINAL]
            if (not open_jobs and not open_runs) or time.monotonic() > deadline:
                return [j.job_id for j in open_jobs] + [t.transform_id for t in open_runs]
            await asyncio.gather(
                *(self._read(tenant, open_jobs, open_runs) for tenant in self.keys),
                return_exceptions=True,
            )
            await asyncio.sleep(1)

    async def _read(
        self, tenant: str, open_jobs: list[Submit], open_runs: list[TransformRun]
    ) -> None:
        mine = [j for j in open_jobs if j.tenant == tenant]
        async with self._client(tenant) as client:
            for start in range(0, len(mine), 500):
                chunk = {j.job_id: j for j in mine[start : start + 500]}
                r = await client.post("/v1/jobs/status", json={"ids": list(chunk)})
                r.raise_for_status()
                for job in r.json()["jobs"]:
                    self._record(chunk[job["id"]], job)
            for run in (t for t in open_runs if t.tenant == tenant):
                r = await client.get(f"/v1/transforms/{run.transform_id}")
                r.raise_for_status()
                run.answer = r.json()
                run.status = run.answer["status"]

    @staticmethod
    def _record(submit: Submit, job: dict[str, Any]) -> None:
        submit.status = job["status"]
        submit.error_code = (job.get("error") or {}).get("code") or job.get("error_code")
        submit.created_at = stamp(job.get("created_at"))
        submit.finished_at = stamp(job.get("finished_at"))

    def outputs(self, tenant: str, ids: list[str]) -> dict[str, Any]:
        """The API's answers for `ids`, with their outputs as JSON."""

        async def read() -> dict[str, Any]:
            found: dict[str, Any] = {}
            async with self._client(tenant) as client:
                for start in range(0, len(ids), 200):
                    r = await client.post("/v1/jobs/status", json={"ids": ids[start : start + 200]})
                    r.raise_for_status()
                    found.update((job["id"], job) for job in r.json()["jobs"])
            return found

        return asyncio.run(read())
