"""Broadcast in a real browser: Debian's chromium (Playwright) opens a page of a FastAPI
app that mounts the SSE endpoint, subscribes (the JS helper on a private channel, plain
EventSource on a public one), and shows a queued notification and a broadcast event the
worker published. Screenshot: test-artifacts/broadcast/page.png (gitignored)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.broadcast import bc_app
from tests.broadcast.support import KEY, ROOT, env_for
from tests.support import Proc, free_port, wait_for
from tidings import App
from tidings.errors import BlockingDispatchWarning

ARTIFACTS = ROOT / "test-artifacts" / "broadcast"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")


@pytest.fixture
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: install Debian's chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def test_a_page_shows_the_broadcast_notification(
    redis_url: str, prefix: str, spawn_proc: Callable[..., Proc], browser: object
) -> None:
    from playwright.sync_api import Browser, expect

    assert isinstance(browser, Browser)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    env = env_for(redis_url, prefix, BC_HEARTBEAT_S="2")
    port = free_port()
    web = spawn_proc([sys.executable, "-m", "uvicorn", "tests.broadcast.web_app:web",
                      "--port", str(port), "--log-level", "warning"],
                     name="web", env=env, cwd=ROOT)  # fmt: skip
    worker = spawn_proc([NOTIFY_WORKER, "-A", "tests.broadcast.bc_app:app", "--sleep", "0.5"],
                        name="worker", env=env, cwd=ROOT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert web.alive(), web.tail()
        try:
            return httpx.get(base + "/", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, 30, 0.1, message="the web app")
    app = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix,
              allowed_modules="tests.broadcast")  # fmt: skip
    try:
        context = browser.new_context()
        context.add_cookies([{"name": "user", "value": "7", "url": base}])
        page = context.new_page()
        page.goto(base + "/")
        expect(page.locator("#state")).to_have_text("connected", timeout=20_000)
        # the private subscription is a second request: wait until it is being read
        r = app.queue_for(None).client
        wait_for(lambda: any(c.get("cmd") == "xread" for c in r.client_list()), 20, 0.05,
                 message="the web process's reader")  # fmt: skip
        page.wait_for_timeout(300)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BlockingDispatchWarning)
            bc_app.User(7).notify(bc_app.InvoicePaid(42))
            bc_app.User(8).notify(bc_app.InvoicePaid(99))  # another user's: never shown
            app.dispatch(bc_app.Announcement("hello browsers"))
        expect(page.locator("#helper li")).to_have_text(
            ["Invoice paid: 42 on private-User.7"], timeout=30_000
        )
        expect(page.locator("#plain li")).to_have_text(["HELLO BROWSERS"], timeout=30_000)
        page.wait_for_timeout(500)
        expect(page.locator("#helper li")).to_have_count(1)
        page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
        assert (ARTIFACTS / "page.png").stat().st_size > 1000
        assert worker.alive(), worker.tail()
        context.close()
    finally:
        app.close()
