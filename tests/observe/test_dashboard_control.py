"""Issue 23 on the dashboard: the job page's progress, priority and Cancel button, and the
batch page's running members, over HTTP against the ASGI app on the test's real Redis
(httpx's ASGI transport). The browser test (a real worker cancelling a running job) is
``test_dashboard_browser.py::test_job_page_progress_and_cancel_of_a_running_job``.

Progress records are planted in their stored layout (the worker's ``progress`` script
writes exactly this JSON under ``QueueKeys.progress``): these tests are about the page.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import orjson
import pytest

from tests.observe.dash_app import Crawl
from tidings import App, batch
from tidings.dashboard import Auth, create_app

KEY = "dashboard-test-key-0123456789abcdef"
MODULE = "tests.observe.dash_app"
TOKEN = "Xq3v9KpT2rW7mZ4nB8cY1dF6gH0jL5sA-uE_oI"
LOCAL = "http://127.0.0.1:8765"
CONTROL = {"\x1b", "\x00", "\x07", "\u202e", "\r"}


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE)
    try:
        yield a
    finally:
        a.close()


def client(asgi: Any, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=LOCAL, **kw)


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF field in the page"
    return m.group(1)


def plant_progress(app: App, queue: str, job_id: str, done: float, total: float | None,
                   note: str | None) -> None:  # fmt: skip
    rq = app.queue_for(None)
    doc = {"done": done, "total": total, "note": note, "at": time.time()}
    rq.client.set(rq.keys(queue).progress(job_id), orjson.dumps(doc))


def outcome_of(response: httpx.Response) -> str:
    assert response.status_code == 303, response.text
    query = parse_qs(urlsplit(response.headers["location"]).query)
    return query["cancel"][0]


def test_job_page_shows_state_priority_progress_and_escapes_the_note(app: App) -> None:
    job_id = Crawl("p").with_priority(40).dispatch()
    assert job_id
    plant_progress(app, "default", job_id, 3, 10, "row 3 \x1b[2J\x07 <b>bold</b> \u202eexe")
    web = create_app(app, auth=Auth())

    async def main() -> str:
        async with client(web) as c:
            page = await c.get(f"/jobs/{job_id}")
            assert page.status_code == 200, page.text
            return page.text

    html = asyncio.run(main())
    assert re.search(r'id="job-state">pending<', html)
    assert re.search(r'id="job-priority">40<', html)
    assert '<progress max="100" value="30.0">' in html
    assert '3</span> / <span class="total">10</span> (30 %)' in html
    assert "Crawl" in html
    # The note: visible escapes, never a raw control or bidi character, never markup.
    assert not CONTROL & set(html)
    assert "row 3 \\x1b[2J\\x07 &lt;b&gt;bold&lt;/b&gt; \\u202eexe" in html
    assert 'id="cancel-job"' in html


def test_cancel_needs_the_csrf_token_and_the_credentials(app: App) -> None:
    job_id = Crawl("c").dispatch()
    assert job_id
    web = create_app(app, auth=Auth(token=TOKEN))
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    async def main() -> None:
        async with client(web) as c:
            # no credentials: the guard refuses before the form is read
            r = await c.post("/jobs/cancel", data={"id": job_id, "csrf": "x"})
            assert r.status_code == 401
            # credentials, no token / a made-up one / a foreign origin
            r = await c.post("/jobs/cancel", data={"id": job_id}, headers=bearer)
            assert r.status_code == 403
            r = await c.post("/jobs/cancel", data={"id": job_id, "csrf": "forged"},
                             headers=bearer)  # fmt: skip
            assert r.status_code == 403
            page = await c.get(f"/jobs/{job_id}", headers=bearer)
            token = csrf_of(page.text)
            r = await c.post("/jobs/cancel", data={"id": job_id, "csrf": token},
                             headers={"Origin": "http://evil.example", **bearer})  # fmt: skip
            assert r.status_code == 403
            assert app.job_status(job_id) == "pending"
            # the page's own form token: cancelled
            r = await c.post("/jobs/cancel", data={"id": job_id, "csrf": token},
                             headers=bearer)  # fmt: skip
            assert outcome_of(r) == "cancelled"
        assert app.job_status(job_id) == "cancelled"

    asyncio.run(main())


def test_cancel_of_a_delayed_job_resent_and_of_garbage_ids(app: App) -> None:
    job_id = Crawl("d").delay(300).dispatch()
    assert job_id
    web = create_app(app, auth=Auth())

    async def main() -> None:
        async with client(web) as c:
            page = await c.get(f"/jobs/{job_id}")
            assert re.search(r'id="job-state">delayed<', page.text)
            token = csrf_of(page.text)
            r = await c.post("/jobs/cancel", data={"id": job_id, "csrf": token})
            assert outcome_of(r) == "cancelled"
            shown = await c.get(r.headers["location"])
            assert "Cancelled: the job was waiting and will never run." in shown.text
            assert re.search(r'id="job-state">cancelled<', shown.text)
            assert 'id="cancel-job"' not in shown.text  # nothing left to cancel
            # sent again (a double click, a re-sent form): the same answer, until a
            # worker settled the marked job ("cancelled already" after; see the browser
            # test for a finished job's answer)
            r = await c.post("/jobs/cancel", data={"id": job_id, "csrf": token})
            assert outcome_of(r) == "cancelled"
            # garbage ids: a clear "no such job", control characters escaped
            for garbage in ("no-such-job-0000", "\x1b[2J<script>alert(1)</script>\u202e",
                            "x" * 500, ""):  # fmt: skip
                r = await c.post("/jobs/cancel", data={"id": garbage, "csrf": token})
                assert outcome_of(r) == "missing"
                shown = await c.get(r.headers["location"])
                assert "No such job: no queue knows this id." in shown.text
                assert not CONTROL & set(shown.text)
                assert "<script>alert" not in shown.text
            # a code not ours is not shown (outcomes are codes, never free text)
            spoof = await c.get(f"/jobs/{job_id}", params={"cancel": "your data was deleted"})
            assert "your data was deleted" not in spoof.text
            assert 'id="cancel-outcome"' not in spoof.text
        assert app.job_status(job_id) == "cancelled"

    asyncio.run(main())


def test_batch_page_shows_its_running_members_progress(app: App) -> None:
    batch_id = batch([Crawl(f"b{i}") for i in range(3)]).name("crawl <all>").dispatch()
    members = [m.decode() for m in app.queue_for(None).client.smembers(
        f"{app.settings.prefix}:batch:{{{batch_id}}}:members")]  # fmt: skip
    assert len(members) == 3
    plant_progress(app, "default", members[0], 7, 20, "member \x1b[31m note")
    plant_progress(app, "default", members[1], 2, None, None)
    web = create_app(app, auth=Auth())

    async def main() -> tuple[str, str]:
        async with client(web) as c:
            listing = await c.get("/batches")
            page = await c.get(f"/batches/{batch_id}")
            assert page.status_code == 200, page.text
            missing = await c.get("/batches/no-such-batch")
            assert missing.status_code == 404
            return listing.text, page.text

    listing, html = asyncio.run(main())
    assert f'href="/batches/{batch_id}"' in listing
    assert "crawl &lt;all&gt;" in html
    rows = re.findall(r"<tr><td><a href=\"/jobs/([^\"]+)\">", html)
    assert sorted(rows) == sorted(members[:2])
    assert "7 / 20" in html and '<progress max="100" value="35.0">' in html
    assert "member \\x1b[31m note" in html and not CONTROL & set(html)
