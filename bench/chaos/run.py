"""One chaos run: the fleet up, the load on, faults at random from the seed, then the checker."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.chaos.check import Report, Watcher, check
from bench.chaos.faults import Fault, Faults, Fleet
from bench.chaos.load import BATCH, Load
from bench.chaos.postgres import RestartablePostgres, private_postgres
from db import tenants
from db.engine import make_engine, make_sessionmaker
from tests.conftest import POSTGRES_URL
from tests.e2e.hosts import JobsTable, open_cluster
from tests.e2e.models import build_faulty
from tffleet.objectstore import ObjectStore, open_store

LEASE_S = 6
ENV = {
    "TFFLEET_LEASE_S": str(LEASE_S),
    "TFFLEET_SWEEP_INTERVAL_S": "1",
    "TFFLEET_MODEL_POLL_S": "1",
    "TFFLEET_REPUBLISH_AFTER_S": "3",
    "TFFLEET_MAX_ATTEMPTS": "3",
}
LONGEST_S = LEASE_S + 5  # a worker host stopped past its lease, or cut off
TENANTS = ("acme", "globex", "initech")


def chaos(
    root: Path,
    *,
    duration_s: float,
    seed: int,
    load_seed: int | None = None,
    rate: float = 15,
    gap_s: tuple[float, float] = (4, 12),
    tail_s: float = 10,
    out: Callable[[str], None] = print,
) -> Report:
    """`duration_s` of load with faults, then the check. The faults come in an order the seed
    shuffles, each kind once before any twice; `gap_s` apart (at random, between the two), the
    last over `tail_s` before the load stops. The
    load (each request's tenant, kind and inputs) comes from `load_seed`, by default `seed`."""
    rng = random.Random(seed)
    started = time.monotonic()
    weights = build_faulty(root / "models")
    (root / "models" / "faulty" / "model.toml").write_text(f"max_batch_size = {BATCH}\n")
    store_url = f"file:{root / 'objects'}"
    store = open_store(store_url)
    env = {**ENV, "TFFLEET_OBJECT_STORE": store_url}
    with private_postgres() as postgres:
        server = postgres.url if postgres else POSTGRES_URL
        out(f"PostgreSQL: {'a private server, ' + server if postgres else 'the test server'}")
        with open_cluster(root, root / "models", env=env, postgres_url=server) as cluster:
            table = JobsTable(cluster.database_url)
            fleet = Fleet(cluster, table)
            try:
                fleet.start()
                out(
                    f"fleet up ({cluster.mode}) after {time.monotonic() - started:.1f}s: api, "
                    f"sweeper, w1 and w2 ({fleet.cluster.url})"
                )
                return _run(
                    cluster.url, fleet, postgres, store, weights, rng,
                    seed if load_seed is None else load_seed,
                    duration_s=duration_s, rate=rate, gap_s=gap_s, tail_s=tail_s, out=out,
                )  # fmt: skip
            finally:
                fleet.stop()
                table.close()


def _keys(database_url: str) -> dict[str, str]:
    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine).begin() as session:
            return {t: tenants.create_key(session=session, tenant=t).key for t in TENANTS}
    finally:
        engine.dispose()


def _run(
    url: str,
    fleet: Fleet,
    postgres: RestartablePostgres | None,
    store: ObjectStore,
    weights: np.ndarray,
    rng: random.Random,
    seed: int,
    *,
    duration_s: float,
    rate: float,
    gap_s: tuple[float, float],
    tail_s: float,
    out: Callable[[str], None],
) -> Report:
    def put(tenant: str, name: str, data: bytes) -> None:
        store.put(f"{tenant}/datasets/{name}", data)

    def read_parts(tenant: str, transform_id: str) -> list[bytes]:
        prefix = f"{tenant}/transforms/{transform_id}/"
        keys = store.keys(prefix)
        names = sorted(k for k in keys if k.endswith(".npy") and "/errors/" not in k)
        return [bytes(store.get(n)) for n in names]

    faults = Faults(fleet, postgres, lease_s=LEASE_S, rng=rng)
    load = Load(
        url,
        _keys(fleet.cluster.database_url),
        rate=rate,
        seed=seed,
        put_dataset=put,
        transform_every_s=max(15.0, duration_s / 8),
    )
    watcher = Watcher(fleet.table)
    watcher.start()
    load.start()
    began, began_wall = time.monotonic(), time.time()
    kinds = list(faults.kinds)
    rng.shuffle(kinds)
    hit: list[Fault] = []
    # The last fault is over `tail_s` before the load stops (the longest lasts about LONGEST_S).
    last_start = duration_s - tail_s - LONGEST_S
    time.sleep(rng.uniform(*gap_s) / 2)
    for kind in itertools.cycle(kinds):
        if time.monotonic() - began > last_start or load.error is not None:
            break
        fault = faults.inject(kind)
        hit.append(fault)
        out(
            f"{fault.at - began_wall:6.1f}s  {fault.kind} {fault.target} {fault.detail} "
            f"({len(fault.victims)} jobs running on it; over after {fault.over_at - fault.at:.1f}s)"
        )
        time.sleep(rng.uniform(*gap_s))
    while time.monotonic() - began < duration_s:
        time.sleep(0.2)
    load.stop()
    stopped = time.time()
    out(f"load stopped after {time.monotonic() - began:.1f}s: {len(load.jobs)} jobs accepted")
    unfinished = load.poll(timeout_s=180)
    out(f"answers read after {time.monotonic() - began:.1f}s")
    watcher.stop()
    fleet.note_sweeper_active(hit)
    report = check(
        load, hit, watcher, weights, read_parts, unfinished,
        host_of=fleet.cluster.host_of, began=began_wall, stopped=stopped, slow_s=LEASE_S + 10,
    )  # fmt: skip
    if load.error is not None:
        report.failures.append(f"the load failed: {load.error!r}")
    exits = fleet.unplanned_exits()
    if exits:  # not a check of its own: the supervisor restarted them, as a service manager
        report.lines.append(f"exited on their own (restarted): {exits}")
    return report
