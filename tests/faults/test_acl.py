"""A Redis ACL user restricted to the app's key prefix and without dangerous commands
runs the whole flow: dispatch, worker (start-up checks, pop, ack, leases), monitor. The
ACL is the one docs/security.md recommends."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from tests.faults.conftest import Rig, exited, figure
from tests.faults.fault_app import Record
from tests.support import RedisServer

pytestmark = pytest.mark.timeout(60)


def test_acl_user_limited_to_the_prefix_runs_everything(
    redis_server: RedisServer, make_rig: Callable[..., Rig], prefix: str
) -> None:
    admin = redis_server.client()
    # docs/security.md: ACL SETUSER tidings on >PASSWORD ~PREFIX:* resetchannels
    #                   +@all -@dangerous +info
    admin.execute_command(
        "ACL", "SETUSER", "tidings", "on", ">pw-0123456789", f"~{prefix}:*", "resetchannels",
        "+@all", "-@dangerous", "+info",
    )  # fmt: skip
    url = f"redis://tidings:pw-0123456789@{redis_server.host}:{redis_server.port}/0"
    rig = make_rig(url)
    names = [f"acl{i}" for i in range(20)]
    rig.app.dispatch_many([Record(n) for n in names])
    Record("late").delay(0.5).dispatch()
    w = rig.worker("--stop-when-empty", name="acl-worker")
    assert exited(w, 30) == 0, w.tail()
    lost, extra = rig.figures([*names, "late"])
    assert (lost, extra) == (0, 0)
    assert "NOPERM" not in w.output()
    monitor = rig.cli("monitor", "--json")
    assert monitor.returncode == 0, monitor.stderr
    # ... and the user really is confined: other keys and dangerous commands are refused.
    limited = redis.Redis.from_url(url)
    with pytest.raises(redis.exceptions.NoPermissionError):
        limited.set("elsewhere", 1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        limited.flushall()
    limited.close()
    figure(f"ACL user on ~{prefix}:* -@dangerous: 21 jobs, lost {lost}, extra {extra}")
