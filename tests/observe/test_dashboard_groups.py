"""The dashboard's groups page (fair groups, issue 25): backlog per group, the biggest
first, pause and resume behind the CSRF check, hostile group keys escaped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.observe.dash_app import Flaky
from tests.observe.test_dashboard_security import KEY, MODULE, client, csrf_of
from tidings import App
from tidings.dashboard import Auth, create_app


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE)
    try:
        yield a
    finally:
        a.close()


def test_the_groups_page_lists_backlogs_and_pauses_and_resumes_with_csrf(app: App) -> None:
    for i in range(3):
        Flaky(f"a{i}").on_group("acme").dispatch()
    Flaky("b").on_group("beta").dispatch()
    app.groups.limit("acme", concurrency=2)
    hostile = "evil\x1b[2J<script>"
    r = app.queue_for(None).client
    r.rpush(app.queue_for(None).keys("default").group("g", hostile), "0" * 32)
    web = create_app(app, auth=Auth())

    async def main() -> None:
        async with client(web) as c:
            page = await c.get("/groups")
            assert page.status_code == 200
            text = page.text
            assert text.index("acme") < text.index("beta")  # biggest backlog first
            assert "\x1b" not in text and "<script>" not in text and "evil" in text
            token = csrf_of(text)
            # No token: refused, nothing changes.
            refused = await c.post("/groups/pause", data={"group": "acme", "queue": "default"})
            assert refused.status_code == 403
            assert not app.groups.show("acme").paused
            done = await c.post(
                "/groups/pause",
                data={"group": "acme", "queue": "default", "csrf": token},
                headers={"Origin": "http://127.0.0.1:8765"},
            )
            assert done.status_code == 303
            assert app.groups.show("acme").paused
            page = await c.get(done.headers["location"])
            assert "paused" in page.text and "Resume" in page.text
            done = await c.post(
                "/groups/resume",
                data={"group": "acme", "queue": "default", "csrf": csrf_of(page.text)},
                headers={"Origin": "http://127.0.0.1:8765"},
            )
            assert done.status_code == 303 and not app.groups.show("acme").paused

    asyncio.run(main())
