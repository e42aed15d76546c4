"""F11: the primary dies and a replica takes over.

Two ways a deployment follows a failover, both tested:

* **Sentinel** (``redis+sentinel://host:port/SERVICE``): clients ask the sentinels for the
  primary on every new connection (redis-py's SentinelConnectionPool), so workers and
  producers follow a promotion by themselves. One sentinel (quorum 1) on loopback,
  ``down-after-milliseconds 1000``.
* **Manual re-point**: the operator promotes the replica (``REPLICAOF NO ONE``) and moves
  the address the workers use (a DNS name, a VIP, HAProxy; here a TCP proxy whose target
  changes). tidings needs no hook for this: workers retry connection errors with a capped
  backoff and reload their scripts (``NOSCRIPT`` -> ``EVAL``) on the new server.

Replication is asynchronous, so the figure is about jobs whose dispatch the producer
confirmed as replicated (``WAIT 1 100`` returned 1): all of them must run. Jobs not
confirmed may be lost with the primary, as Redis documents.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.faults.conftest import Rig, Sampler, figure
from tests.faults.fault_app import Plain, Work
from tests.support import FaultProxy, Proc, RedisServer, free_port, wait_for
from tidings.errors import QueueUnavailable

pytestmark = pytest.mark.timeout(60)

SERVICE = "tidings-primary"
WORKERS = 2
CONCURRENCY = 4


def _replica(
    factory: Callable[..., RedisServer], primary: RedisServer
) -> tuple[RedisServer, redis.Redis]:
    replica = factory(
        appendonly=True,
        appendfsync="always",
        extra_args=["--replicaof", primary.host, str(primary.port)],
    )
    r = replica.client()
    wait_for(
        lambda: r.info("replication").get("master_link_status") == "up",
        10,
        message="replica in sync",
    )
    return replica, r


def _sentinel(tmp_path: Path, primary: RedisServer, spawn: Callable[..., Proc]) -> int:
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor {SERVICE} {primary.host} {primary.port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 5000\n"
    )
    spawn([primary.binary, str(conf), "--sentinel"], name="sentinel", cwd=tmp_path)
    s = redis.Redis(port=port, socket_timeout=1)

    def knows_replica() -> bool:
        try:
            return len(s.sentinel_slaves(SERVICE)) >= 1
        except redis.RedisError:
            return False

    wait_for(knows_replica, 15, 0.1, message="sentinel sees the replica")
    s.close()
    return port


class Producer:
    """Dispatches Work jobs in a thread; a job counts as confirmed when ``WAIT 1 100``
    after its dispatch says one replica has it. ``default_tries``: Plain jobs instead,
    with the worker's default tries (1)."""

    def __init__(self, rig: Rig, *, default_tries: bool = False) -> None:
        self.rig = rig
        self.default_tries = default_tries
        self.confirmed: list[str] = []
        self.unconfirmed: list[str] = []
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = self.rig.app.queue_for(None).client
        i = 0
        while not self._stop.is_set():
            name = f"f{i}"
            i += 1
            try:
                (Plain if self.default_tries else Work)(name, 0.02).dispatch()
            except QueueUnavailable:
                self.refused += 1
                self._stop.wait(0.1)
                continue
            try:
                replicas = int(client.execute_command("WAIT", 1, 100))
            except redis.RedisError:
                replicas = 0
            (self.confirmed if replicas >= 1 else self.unconfirmed).append(name)
            self._stop.wait(0.01)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


def _figures(
    rig: Rig, producer: Producer, sampler: Sampler, t_promoted: float, row: str
) -> tuple[int, int]:
    rig.wait_executed(producer.confirmed, 30)
    wait_for(rig.drained, 15, message="queue drained on the new primary")
    counts = rig.hash("exec")
    lost = [n for n in producer.confirmed if n not in counts]
    lost_unconfirmed = [n for n in producer.unconfirmed if n not in counts]
    extra = sum(c - 1 for c in counts.values() if c > 1)
    before = next((n for t, n in sampler.samples if t >= t_promoted), 0)
    resumed = next((t for t, n in sampler.samples if t >= t_promoted and n > before), None)
    resume_s = None if resumed is None else resumed - t_promoted
    figure(
        f"{row}: {len(producer.confirmed)} confirmed jobs, lost {len(lost)}; unconfirmed "
        f"{len(producer.unconfirmed)} (lost {len(lost_unconfirmed)}); extra runs {extra}; "
        f"{producer.refused} dispatches refused during the failover; workers resumed "
        f"{resume_s if resume_s is None else round(resume_s, 2)}s after the promotion"
    )
    assert lost == []
    assert extra <= WORKERS * CONCURRENCY
    assert resume_s is not None and resume_s <= 10
    assert all(w.alive() for w in rig.workers)
    return len(lost), extra


def test_f11_sentinel_failover_workers_follow_the_new_primary(
    tmp_path: Path,
    redis_server_factory: Callable[..., RedisServer],
    make_rig: Callable[..., Rig],
    spawn_proc: Callable[..., Proc],
) -> None:
    primary = redis_server_factory(appendonly=True, appendfsync="always")
    _, r = _replica(redis_server_factory, primary)
    port = _sentinel(tmp_path, primary, spawn_proc)
    rig = make_rig(f"redis+sentinel://127.0.0.1:{port}/{SERVICE}/0")
    # tries 1 (the default): a job whose ack was lost in the switch and which is handed
    # out again after its lease is a stall and runs again, never MaxAttemptsExceeded.
    with Sampler(rig) as sampler, Producer(rig, default_tries=True) as producer:
        for i in range(WORKERS):
            rig.worker("--concurrency", str(CONCURRENCY), name=f"w{i}")
        wait_for(lambda: rig.executed() >= 200, 30, 0.05, message="200 executed")
        primary.kill()
        t_kill = time.monotonic()
        wait_for(lambda: r.info("replication")["role"] == "master", 20, 0.05, message="promotion")
        t_promoted = time.monotonic()
        at_promotion = rig.executed()
        wait_for(lambda: rig.executed() >= at_promotion + 20, 20, 0.05, message="progress")
        time.sleep(0.5)
    figure(f"F11 sentinel: replica promoted {t_promoted - t_kill:.2f}s after SIGKILL of primary")
    _figures(rig, producer, sampler, t_promoted, "F11 sentinel failover")
    assert "Redis data reset" not in rig.logs()  # the replica had the data
    assert [f.exception.splitlines()[-1] for f in rig.app.queue_for(None).failed()] == []


def test_f11_manual_promotion_and_re_point(
    redis_server_factory: Callable[..., RedisServer],
    make_rig: Callable[..., Rig],
    fault_proxy_factory: Callable[[str, int], FaultProxy],
) -> None:
    primary = redis_server_factory(appendonly=True, appendfsync="always")
    replica, r = _replica(redis_server_factory, primary)
    proxy = fault_proxy_factory(primary.host, primary.port)  # "the address workers use"
    rig = make_rig(proxy.url())
    with Sampler(rig) as sampler, Producer(rig) as producer:
        for i in range(WORKERS):
            rig.worker("--concurrency", str(CONCURRENCY), name=f"w{i}")
        wait_for(lambda: rig.executed() >= 200, 30, 0.05, message="200 executed")
        primary.kill()
        time.sleep(0.5)
        r.execute_command("REPLICAOF", "NO", "ONE")
        proxy.target_port = replica.port  # re-point: new connections reach the replica
        proxy.mode = "reset"  # drop connections still half-open towards the old primary
        proxy.mode = "pass"
        t_promoted = time.monotonic()
        at_promotion = rig.executed()
        wait_for(lambda: rig.executed() >= at_promotion + 20, 20, 0.05, message="progress")
        time.sleep(0.5)
    _figures(rig, producer, sampler, t_promoted, "F11 manual REPLICAOF NO ONE + re-point")
