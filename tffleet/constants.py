"""Names shared across processes: Redis channels and keys."""

# Workers publish the ids of jobs that ended (a JSON list) here; the API's long-polls listen.
JOBS_DONE_CHANNEL = "tffleet:jobs:done"

# Held by the one active sweeper (a redis-py Lock with an expiry, extended every sweep).
SWEEPER_LOCK_KEY = "tffleet:sweeper:lock"

# `tffleet models reload` publishes here; every worker child rescans the model repository at once.
MODELS_RELOAD_CHANNEL = "tffleet:models:reload"

# An API key's token bucket (its rate, `tffleet keys set --rate`), shared by every API process:
# a hash of `tokens` and `at` (Redis's clock), expiring once it would be full again.
RATE_BUCKET_KEY = "tffleet:rate:{prefix}"
