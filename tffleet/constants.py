"""Names shared across processes: Redis channels and keys."""

# Workers publish the ids of jobs that ended (a JSON list) here; the API's long-polls listen.
JOBS_DONE_CHANNEL = "tffleet:jobs:done"
