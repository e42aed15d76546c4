"""F12: Redis at ``maxmemory`` with ``noeviction``.

The producer fills the queue one ``dispatch()`` at a time until Redis refuses; every
refusal must be a typed ``QueueUnavailable`` that wrote nothing, every accepted job must
run, and workers must drain the full queue to 0 while Redis is at its limit (the worker's
scripts start with a write that frees memory, so Redis lets them run; see
docs/guarantees.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.faults.conftest import Rig, figure
from tests.faults.fault_app import Record
from tests.support import RedisServer, wait_for
from tidings.errors import QueueUnavailable

pytestmark = pytest.mark.timeout(90)

OOM_ARGS = ["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]


def test_f12_noeviction_dispatch_raises_and_the_full_queue_drains(
    redis_server_factory: Callable[..., RedisServer], make_rig: Callable[..., Rig]
) -> None:
    server = redis_server_factory(appendonly=True, appendfsync="everysec", extra_args=OOM_ARGS)
    rig = make_rig(server.url)
    accepted: list[str] = []
    refused: list[tuple[str, QueueUnavailable]] = []
    t0 = time.monotonic()
    i = 0
    while len(refused) < 20 and i < 100_000:
        name = f"m{i}"
        i += 1
        try:
            Record(name).dispatch()
        except QueueUnavailable as exc:
            refused.append((name, exc))
            continue
        accepted.append(name)
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
        f"F12 noeviction 3mb: {len(accepted)} dispatches accepted in {fill_s:.2f}s, then "
        f"{len(refused)} refused with QueueUnavailable; workers drained the full queue in "
        f"{drain_s:.2f}s: lost {lost}, extra {extra}, refused-but-run {len(ran_refused)}"
    )
    assert (lost, extra, ran_refused) == (0, 0, [])
    assert all(w.alive() for w in workers)
    assert "maxmemory-policy" not in rig.logs()  # noeviction: no warning
    Record("after").dispatch()  # room again
    rig.wait_executed(["after"], 10)
