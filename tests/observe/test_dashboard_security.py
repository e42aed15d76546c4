"""The dashboard's security rules, over HTTP against the ASGI app (httpx's ASGI transport)
and the ``notify-worker dashboard`` command.

CSRF refusal (no token, a wrong token, a foreign Origin), auth by token (header and
login cookie) and basic auth, the refusal to bind a non-loopback address without
credentials, escaping, and mounting under a path prefix (Starlette Mount and the
:class:`PrefixDispatcher` a Django project would use).
"""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from tests.observe.dash_app import Flaky
from tidings import App
from tidings.dashboard import Auth, PrefixDispatcher, check_bind, create_app
from tidings.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
KEY = "dashboard-test-key-0123456789abcdef"
MODULE = "tests.observe.dash_app"
TOKEN = "Xq3v9KpT2rW7mZ4nB8cY1dF6gH0jL5sA-uE_oI"  # 38 random characters


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE)
    try:
        yield a
    finally:
        a.close()


def failed_job(app: App) -> str:
    """Put one job straight into the failed store (through the real fail script)."""
    import tidings.worker.worker as w

    job_id = Flaky("x").dispatch()
    assert job_id
    opts = w.WorkerOptions(stop_when_empty=True, sleep_s=0.2)
    asyncio.run(w.Worker(app, opts).run())
    assert app.job_status(job_id) == "failed"
    return job_id


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def client(asgi: Any, **kw: Any) -> httpx.AsyncClient:
    kw.setdefault("base_url", "http://127.0.0.1:8765")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), **kw)


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF field in the page"
    return m.group(1)


def test_state_changes_need_the_csrf_token(app: App) -> None:
    job_id = failed_job(app)
    web = create_app(app, auth=Auth())

    async def main() -> None:
        async with client(web) as c:
            page = await c.get("/failed")
            assert page.status_code == 200
            token = csrf_of(page.text)
            nonce = c.cookies.get("tidings_csrf")
            assert nonce and nonce != token  # the form token is signed, not the cookie
            # no token, a wrong token, GET instead of POST, a foreign Origin: all refused
            r = await c.post("/failed/retry", data={"id": job_id})
            assert r.status_code == 403
            r = await c.post("/failed/retry", data={"id": job_id, "csrf": token + "x"})
            assert r.status_code == 403
            r = await c.get(f"/failed/retry?id={job_id}&csrf={token}")
            assert r.status_code in (404, 405)
            r = await c.post("/failed/retry", data={"id": job_id, "csrf": token},
                             headers={"Origin": "http://evil.example"})  # fmt: skip
            assert r.status_code == 403
            # another browser (no cookie) with a stolen form token is refused too
            async with client(web) as other:
                r = await other.post("/failed/forget", data={"id": job_id, "csrf": token})
                assert r.status_code == 403
            assert app.job_status(job_id) == "failed"  # nothing changed
            r = await c.post("/failed/retry", data={"id": job_id, "csrf": token},
                             headers={"Origin": "http://127.0.0.1:8765"})  # fmt: skip
            assert r.status_code == 303
            assert app.job_status(job_id) == "pending"

    run(main())


def test_token_auth_header_and_login_cookie(app: App) -> None:
    web = create_app(app, auth=Auth(token=TOKEN))

    async def main() -> None:
        async with client(web) as c:
            assert (await c.get("/")).status_code == 401
            assert (await c.get("/metrics")).status_code == 401
            r = await c.get("/", headers={"Accept": "text/html"})
            assert r.status_code == 303 and r.headers["location"] == "/login"
            assert (await c.get("/", headers={"Authorization": "Bearer wrong"})).status_code == 401
            ok = await c.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
            assert ok.status_code == 200
            token = csrf_of((await c.get("/login")).text)
            r = await c.post("/login", data={"token": "nope", "csrf": token})
            assert r.status_code == 403
            r = await c.post("/login", data={"token": TOKEN, "csrf": token})
            assert r.status_code == 303
            cookie = c.cookies.get("tidings_auth")
            assert cookie and TOKEN[:8] not in cookie
            assert (await c.get("/workers")).status_code == 200

    run(main())


def test_basic_auth(app: App) -> None:
    web = create_app(app, auth=Auth(username="ops", password="pa55-word"))
    good = base64.b64encode(b"ops:pa55-word").decode()
    bad = base64.b64encode(b"ops:guess").decode()

    async def main() -> None:
        async with client(web) as c:
            r = await c.get("/")
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
            assert (await c.get("/", headers={"Authorization": f"Basic {bad}"})).status_code == 401
            assert (await c.get("/", headers={"Authorization": f"Basic {good}"})).status_code == 200

    run(main())


def test_non_loopback_bind_needs_credentials() -> None:
    check_bind("127.0.0.1", Auth())
    check_bind("::1", Auth())
    check_bind("localhost", Auth())
    check_bind("0.0.0.0", Auth(token=TOKEN, allowed_hosts=("ops.example.com",)))
    with pytest.raises(ConfigurationError, match="TIDINGS_DASHBOARD_TOKEN"):
        check_bind("0.0.0.0", Auth())
    with pytest.raises(ConfigurationError, match="TIDINGS_DASHBOARD_USER"):
        check_bind("10.1.2.3", Auth(username="ops"))  # a user without a password is no auth


def test_dashboard_command_refuses_a_public_bind(redis_url: str, prefix: str) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TIDINGS_")}
    env.update(PYTHONPATH=str(ROOT), TIDINGS_REDIS_URL=redis_url, TIDINGS_KEY=KEY,
               TIDINGS_PREFIX=prefix)  # fmt: skip
    done = subprocess.run(
        [NOTIFY_WORKER, "dashboard", "--host", "0.0.0.0", "--port", "1"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "TIDINGS_DASHBOARD_TOKEN" in done.stderr and "not loopback" in done.stderr


def test_mounted_under_a_prefix(app: App) -> None:
    failed_job(app)
    dash = create_app(app, auth=Auth())
    host = Starlette(routes=[Route("/", lambda r: PlainTextResponse("host app")),
                             Mount("/ops/tidings", app=dash)])  # fmt: skip

    async def fallback(scope: Any, receive: Any, send: Any) -> None:
        await PlainTextResponse("django")(scope, receive, send)

    django_like = PrefixDispatcher(dash, fallback, prefix="/tidings")

    async def main() -> None:
        async with client(host) as c:
            assert (await c.get("/")).text == "host app"
            page = await c.get("/ops/tidings/failed")
            assert page.status_code == 200
            assert 'href="/ops/tidings/workers"' in page.text
            assert 'action="/ops/tidings/failed/retry"' in page.text
            css = await c.get("/ops/tidings/static/dashboard.css")
            assert css.status_code == 200 and "svg.chart" in css.text
        async with client(django_like) as c:
            assert (await c.get("/admin/")).text == "django"
            page = await c.get("/tidings/failed")
            assert page.status_code == 200 and 'href="/tidings/workers"' in page.text
            token = csrf_of(page.text)
            nonce = c.cookies.get("tidings_csrf")
            assert nonce and nonce != token  # the form token is signed, not the cookie
            r = await c.post("/tidings/failed/retry", data={"all": "1", "csrf": token})
            assert r.status_code == 303 and r.headers["location"].startswith("/tidings/failed")

    run(main())


def test_hostile_values_are_escaped_in_html(app: App) -> None:
    rq = app.queue_for(None)
    k = rq.keys("<q>")
    hostile = '"><script>alert(1)</script>'
    rq.client.zadd(k.failed, {"id1": 1})
    quoted = hostile.replace('"', '\\"')
    info = '{"name": "' + quoted + '", "exception": "boom ' + quoted + '", "attempts": 1}'
    rq.client.hset(k.failed_info, "id1", info)
    rq.client.hset(k.failed_body, "id1", b"not json at all <svg onload=alert(1)>")
    web = create_app(app, auth=Auth())

    async def main() -> None:
        async with client(web) as c:
            for path in ("/", "/failed", "/failed/id1", "/jobs?id=" + hostile,
                         "/queues/%3Cq%3E", "/failed?q=" + hostile):  # fmt: skip
                r = await c.get(path)
                assert r.status_code in (200, 404), path
                assert "<script>alert(1)" not in r.text, path
                assert "<svg onload" not in r.text, path
                assert "<q>" not in r.text, path
            assert "&lt;q&gt;" in (await c.get("/")).text
            detail = await c.get("/failed/id1")
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail.text
            assert detail.headers["content-security-policy"].startswith("default-src 'self'")

    run(main())


def test_garbage_in_metrics_keys_breaks_nothing(app: App, redis_url: str, prefix: str) -> None:
    """Hand-written junk in every structure the dashboard and the CLI read."""
    import time as _time

    from tidings.observability.metrics import minute_of

    rq = app.queue_for(None)
    r = rq.client
    m = minute_of(_time.time())
    r.hset(f"{prefix}:stats:{{default}}:classes", mapping={"Junk": "not-a-minute", "\x1b[2J": m})
    r.hset(f"{prefix}:stats:{{default}}:{m}", mapping={"p": "many", "rh99": 5, "zz": 1, "ru": -3})
    r.set(f"{prefix}:stats:{{default}}:{m - 1}", "a string, not a hash")
    r.hset(f"{prefix}:stats:{{default}}:total", mapping={"nopipe": 1, "X|p": "x"})
    r.hset(f"{prefix}:stats:jobs:{m}", mapping={"j1": "garbage", "j2": "q x y z"})
    r.zadd(f"{prefix}:workers", {"w1": _time.time() * 1000, "w2": 1, "w3": _time.time() * 1000})
    r.set(
        f"{prefix}:worker:w1", b'{"pid": "abc", "host": "<b>h</b>", "rss_mb": "lots", "queues": 5}'
    )
    r.set(f"{prefix}:worker:w3", b"\xff\xfe not json")
    web = create_app(app, auth=Auth())

    async def main() -> None:
        async with client(web) as c:
            for path in ("/", "/queues/default", "/workers", "/jobs?id=j1", "/jobs?id=j2",
                         "/metrics", "/failed"):  # fmt: skip
                resp = await c.get(path)
                assert resp.status_code in (200, 404), (path, resp.text[:500])
            workers = await c.get("/workers")
            assert "&lt;b&gt;h&lt;/b&gt;" in workers.text

    run(main())
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TIDINGS_")}
    env.update(PYTHONPATH=str(ROOT), TIDINGS_REDIS_URL=redis_url, TIDINGS_KEY=KEY,
               TIDINGS_PREFIX=prefix)  # fmt: skip
    done = subprocess.run([NOTIFY_WORKER, "workers"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "<b>h</b>" in done.stdout and "1 live worker" in done.stdout
    assert app.job_status("j1") is None  # no queue record: None, not a crash
