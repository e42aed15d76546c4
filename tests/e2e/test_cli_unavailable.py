"""The operator commands when Redis is away: one clear line and exit 69, no traceback."""

from __future__ import annotations

import subprocess

from tests.e2e.test_notify_worker import APP_SPEC, NOTIFY_WORKER, ROOT, _env_for
from tests.support import free_port


def test_monitor_with_redis_down_says_so_and_exits_69() -> None:
    env = _env_for(f"redis://127.0.0.1:{free_port()}/0", "tcli")
    done = subprocess.run(
        [NOTIFY_WORKER, "-A", APP_SPEC, "monitor"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        start_new_session=True,
    )
    assert done.returncode == 69, (done.stdout, done.stderr)
    assert "Redis unavailable" in done.stderr and "TIDINGS_REDIS_URL" in done.stderr
    assert "Traceback" not in done.stderr
