"""A chaos run with a total-queue checker (issue 29).

    .venv/bin/python -m bench.chaos                       # 10 minutes, a random seed
    .venv/bin/python -m bench.chaos --minutes 3 --seed 7  # replay a run

As root (network namespaces; see tests/e2e/hosts.py) a fleet of an API host, a sweeper host and
two worker hosts runs against a PostgreSQL server of the run's own and a Redis on the bridge,
while several tenants submit single, bulk and split jobs and transforms of a model whose outputs
are known (x @ W). A scheduler seeded by `--seed` hits the fleet, one fault at a time: SIGKILL of
a worker child, of a worker's main process, of the API, of the sweeper; SIGSTOP of a worker host
past its lease, then SIGCONT; a Redis restart; a PostgreSQL restart; a worker host's network cut
and restored. A supervisor restarts what was killed. Then the checker (bench/chaos/check.py)
reads the history against the jobs table, and the run prints its figures; it exits 1 on any
check that failed.
"""
