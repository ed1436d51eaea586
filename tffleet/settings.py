"""The one settings object. Every field is read from the environment with the `TFFLEET_` prefix."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TFFLEET_", extra="ignore")

    # The database, the truth of every job (a SQLAlchemy URL: SQLite or PostgreSQL).
    database_url: str = "sqlite:///tffleet.db"
    # The Redis that carries wake-ups (Celery's broker), news of ended jobs and the sweeper's lock:
    # `redis://[:PASSWORD@]HOST:PORT/DB`, `rediss://` (TLS) or `unix:///PATH?db=N` for one Redis;
    # for a Redis that fails over, its sentinels in kombu's form with the master's name,
    # `sentinel://:PASSWORD@HOST1:26379;sentinel://:PASSWORD@HOST2:26379/0?master_name=NAME`
    # (PASSWORD is the master's; add `&sentinel_password=...` if the sentinels ask for their own).
    # Redis Cluster is refused (Celery cannot use it), by its URL or by the node answering.
    broker_url: str = "redis://127.0.0.1:6379/0"
    # The models on disk, a folder per version: MODELS/NAME/VERSION.
    model_repository: Path = Path("models")
    # Where inputs and outputs too big for a database row live (`TFFLEET_INLINE_MAX_BYTES`): a
    # directory, `file:///absolute/dir` or `file:relative/dir` (the default: `.tffleet/objects`
    # under the current directory, relative as the database's default file is; `tffleet up`
    # sets one in its data directory), or `s3://bucket/prefix` on any S3-compatible service. An S3
    # store's endpoint and credentials come from the environment the AWS way
    # (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`) or an
    # instance role, never from this URL. A directory store writes objects of 2 MiB or more
    # straight to the disk (O_DIRECT, where the file system takes it), not through the page
    # cache; a worker reads one back as it fetches its batch, before the forward pass.
    object_store: str = "file:.tffleet/objects"
    # Where transforms may read and write files besides the fleet's own store (which they name
    # `tffleet://datasets/<path>`, under the caller's tenant): comma-separated prefixes,
    # `file:///srv/datasets/` (a directory of this host's, and of every worker's) or
    # `s3://bucket/prefix/` (read with the store's AWS_* credentials). Empty: none. Nothing else is
    # read or written (no http(s)://), nor any path with a `..` part, nor the fleet's own store
    # by a file:// or s3:// URI.
    transform_locations: str = ""
    # Records per shard of a transform that does not say (`shard_records`): a shard is one job,
    # run by one child from its first record to its last, and written as one part file.
    transform_shard_records: int = Field(default=10_000, ge=1, le=1_000_000)
    # The priority of a transform's shards when it does not say: below interactive jobs' 0, so
    # a web app's single jobs never wait behind a transform.
    transform_priority: int = Field(default=-10, ge=-1000, le=1000)
    # Inputs and outputs larger than this (bytes, as `.npy`) live in the object store, their job
    # holding a reference to them; smaller ones are kept inline in the database. 8 KiB keeps a
    # job's row small (a one-sample input of 1024 float32, 4 KiB, stays inline; a CNN job's 10 KiB
    # of outputs go to the store); a medium input then costs the API a write to the store.
    inline_max_bytes: int = Field(default=8 * 1024, ge=0)
    # The largest body streamed into the store, never held (POST /v1/uploads, a large .npy job
    # body, a dataset file's PUT /v1/datasets/{path}; 413 past it), and how long an upload is
    # kept (longer while a job that names it keeps its inputs).
    max_upload_bytes: int = Field(default=2 * 1024**3, gt=0)
    upload_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    # How long an object may take to arrive (an upload, a large input) before its row is
    # committed: what the API writes is named as garbage due this long after it starts, and a
    # row committed later than that is refused (503). 1 h takes TFFLEET_MAX_UPLOAD_BYTES at
    # 0.6 MB/s; raise it with that limit for clients slower than that. Keep it well above a
    # minute: a row committed within 60 s of its objects' due time is refused too.
    upload_grace_s: float = Field(default=3600.0, gt=0)

    # "cpu:N" (N CPU slots), "all" (every visible GPU, or one CPU slot without a GPU),
    # or GPU indices such as "0,1,3". One Celery child process per device.
    devices: str = "all"

    # Where `tffleet api` listens (its --host and --port set them).
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # Every route but /healthz and /readyz takes `Authorization: Bearer <key>` (`tffleet keys`).
    # Off only while the API listens on loopback: every request is then the `default` tenant's
    # admin.
    auth: bool = True
    # /metrics without a key, for a scraper on a private network; else it takes an admin key.
    metrics_public: bool = False
    # The largest request body the API reads; past it the answer is 413.
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # Long-polls one API process holds at once; past it a `wait` is answered at once, as a poll.
    max_long_polls: int = Field(default=10_000, ge=0)
    # How long a protocol facade's request (TF Serving's predict) waits for its job; past it the
    # answer is 504 naming the job, which runs on and is polled at /v1/jobs/{id}.
    protocol_wait_s: float = Field(default=30.0, gt=0, le=3600)
    # JSON items (numbers in nested lists, mostly) one body may hold: parsing and converting
    # them holds the API process ~0.5 s per million here, every other request waiting. Large
    # tensors go as binary envelopes instead (413 above; the Python client sends those).
    max_json_items: int = Field(default=250_000, gt=0)
    # Submissions are refused (429) while this many jobs are queued; 0: no limit.
    max_queued_jobs: int = Field(default=0, ge=0)

    # What one tenant may ask, unless its own limits say otherwise (`tffleet tenants set`).
    # Queued jobs at once (429 `quota_exceeded` above it; 0: no limit), samples in one job (422),
    # the highest priority (422), and the longest retention `ttl_s` (a longer one is cut to it).
    tenant_max_queued_jobs: int = Field(default=100_000, ge=0)
    tenant_max_samples_per_job: int = Field(default=65_536, ge=1, le=2**31 - 1)
    tenant_max_priority: int = Field(default=10, ge=-1000, le=1000)
    tenant_max_ttl_s: int = Field(default=30 * 24 * 3600, ge=1, le=366 * 24 * 3600)

    # Jobs and leases. A running batch's child renews its leases every third of `lease_s`; the
    # jobs of a host that died whole run elsewhere after at most `lease_s` + `sweep_interval_s`
    # (a child that dies alone: its main process hands its jobs back within a second).
    lease_s: float = Field(default=15.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    # How long one forward pass may run; its jobs then end `timeout` and the child is replaced.
    # A model's model.toml may set its own (`timeout_s`).
    job_timeout_s: float = Field(default=300.0, gt=0)

    # The sweeper: how often it runs, when a queued job's wake-up counts as lost, and how long
    # finished jobs (and their outputs) are kept.
    sweep_interval_s: float = Field(default=5.0, gt=0)
    republish_after_s: float = Field(default=30.0, gt=0)
    result_ttl_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    # How long an ended job keeps its inputs: only a retry reads them once it has ended, and
    # they are most of the database's bytes, so they go long before its outputs (a retry after
    # this answers 410 `inputs_gone`). A job's own shorter `ttl_s` takes them sooner, with it.
    input_ttl_s: float = Field(default=3600.0, gt=0)
    # The response cache of models with `cache = true` (db/cache.py): how long an entry answers,
    # and how many bytes of outputs all entries hold at most (the oldest go first).
    cache_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    cache_max_bytes: int = Field(default=1024**3, ge=0)

    # Webhooks (POST /v1/jobs `webhook`), delivered by the sweeper process (worker/webhooks.py):
    # how long a delivery is retried before it is given up, the first back-off (each next one
    # six times longer, up to `webhook_max_backoff_s`, with full jitter), the time limits of one
    # attempt, and how many attempts are in flight at once, in all and per tenant.
    webhook_retry_s: float = Field(default=8 * 3600.0, gt=0)
    webhook_backoff_s: float = Field(default=5.0, gt=0)
    webhook_max_backoff_s: float = Field(default=3600.0, gt=0)
    webhook_connect_timeout_s: float = Field(default=5.0, gt=0)
    webhook_read_timeout_s: float = Field(default=10.0, gt=0)
    webhook_max_in_flight: int = Field(default=32, ge=1)
    webhook_max_in_flight_per_tenant: int = Field(default=8, ge=1)
    # How often the deliverer looks for due deliveries.
    webhook_poll_s: float = Field(default=1.0, gt=0)
    # Webhooks to loopback, private, link-local and other non-public addresses: refused unless
    # true (a receiver on the fleet's own network; the tests' on 127.0.0.1).
    webhook_allow_private: bool = False

    # Batching defaults; a model's own config may override them.
    max_batch_size: int = Field(default=128, ge=1)
    max_queue_delay_ms: float = Field(default=2.0, ge=0)

    # The worker's main process serves its children's Prometheus metrics here (0: not at all).
    worker_metrics_port: int = Field(default=9809, ge=0, le=65535)
    # The address the worker's metrics listen on. They take no key, so loopback by default;
    # 0.0.0.0 for a scraper on another host or container (a private network only).
    worker_metrics_address: str = "127.0.0.1"

    # Models: how often each worker child rescans the repository (new versions, drained ones) and
    # reports what it holds. The API trusts its view of the models this long; a child silent for
    # three polls is taken for dead.
    model_poll_s: float = Field(default=5.0, gt=0)
    # The models a worker's children serve, comma-separated; unset: every model in the
    # repository, including models added to it later. `tffleet worker --models` sets it.
    worker_models: str | None = None
    # A model whose jobs wait while live children hold its version and none has claimed any for
    # longer than this is stalled (consumers connected but not consuming, as Celery workers after
    # a Redis failover): the console warns. Above a poll and a long batch.
    stall_warn_s: float = Field(default=60.0, gt=0)

    # A child must finish loading and warming its models within this time, or Celery kills it.
    model_load_timeout_s: float = Field(default=600.0, gt=0)
    # Redis redelivers an unacknowledged message after this long; keep it above the longest batch.
    visibility_timeout_s: int = Field(default=3600, gt=0)

    @field_validator("devices")
    @classmethod
    def _devices_parse(cls, value: str) -> str:
        from tffleet.devices import parse_devices

        parse_devices(value)  # raises ValueError with a clear message
        return value

    @field_validator("broker_url")
    @classmethod
    def _broker_url_parse(cls, value: str) -> str:
        from tffleet.redis_urls import parse_broker_url

        parse_broker_url(value)  # raises ValueError naming TFFLEET_BROKER_URL
        return value

    @field_validator("object_store")
    @classmethod
    def _object_store_parse(cls, value: str) -> str:
        from tffleet.objectstore.urls import parse_store_url

        parse_store_url(value)  # checks the URL only: the store is opened by those who use it
        return value

    @field_validator("transform_locations")
    @classmethod
    def _transform_locations_parse(cls, value: str) -> str:
        from tffleet.datasets.locations import parse_allowed

        parse_allowed(value)  # raises ValueError naming the prefix that is none
        return value

    @model_validator(mode="after")
    def _auth_off_only_on_loopback(self) -> Settings:
        if not self.auth and not is_loopback(self.api_host):
            raise ValueError(
                f"TFFLEET_AUTH=false is refused while the API listens on {self.api_host} "
                "(TFFLEET_API_HOST): without keys anyone who reaches it sees and cancels every "
                "job. Listen on 127.0.0.1, or keep auth on and make keys with `tffleet keys create`"
            )
        return self

    @model_validator(mode="after")
    def _timeout_below_visibility(self) -> Settings:
        # A batch past its time limit must end before Redis hands its message to another worker.
        if self.job_timeout_s >= self.visibility_timeout_s:
            raise ValueError(
                f"TFFLEET_JOB_TIMEOUT_S ({self.job_timeout_s:g}) must be below "
                f"TFFLEET_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s})"
            )
        return self


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


@lru_cache
def get_settings() -> Settings:
    return Settings()
