"""The endpoint mounted in Starlette (``Mount``) and Django ASGI (``mount()``), each
served by uvicorn: the host app still answers, and subscribers get their messages."""

from __future__ import annotations

import sys
from collections.abc import Callable

import httpx
import pytest

from tests.broadcast.support import KEY, ROOT, env_for, sse
from tests.support import Proc, free_port, wait_for
from tidings import App


@pytest.mark.parametrize(
    ("target", "path", "home"),
    [("starlette_app", "/events", "starlette home"), ("django_app", "/broadcast", "django home")],
)
def test_mounted_endpoint_serves_subscribers_beside_the_host_app(
    redis_url: str, prefix: str, spawn_proc: Callable[..., Proc], target: str, path: str,
    home: str,
) -> None:  # fmt: skip
    port = free_port()
    env = env_for(redis_url, prefix, BC_HEARTBEAT_S="1")
    web = spawn_proc([sys.executable, "-m", "uvicorn", f"tests.broadcast.framework_apps:{target}",
                      "--port", str(port), "--log-level", "warning"],
                     name=target, env=env, cwd=ROOT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert web.alive(), web.tail()
        try:
            return httpx.get(base + "/", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, 30, 0.1, message=f"the {target}")
    assert httpx.get(base + "/", timeout=5).text == home
    app = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix)
    try:
        with (
            sse(base + path, ["private-orders.5"], user=5) as mine,
            sse(base + path, ["private-orders.5"], user=6) as other,
        ):
            assert (mine.status, other.status, other.body) == (200, 403, b"")
            wait_for(lambda: mine.last_id is not None, 10, 0.02, message="the opening id")
            app.broadcasting.publish("private-orders.5", "OrderShipped", {"ok": True})
            [event] = mine.wait_events(1)
            assert event.data == {"channel": "private-orders.5", "data": {"ok": True}}
    finally:
        app.close()
