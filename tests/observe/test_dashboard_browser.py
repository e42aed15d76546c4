"""The dashboard in a real browser: Debian's chromium driven by Playwright.

A real ``notify-worker dashboard`` and a real ``notify-worker`` (with ``--metrics-port``)
run on the test's Redis; the browser loads every page, clicks Retry on a failed job
and sees it run, checks hostile job data is escaped and its secrets redacted, and saves
a screenshot of each page under ``test-artifacts/dashboard/`` (gitignored).

Costs about 15 s (two processes start, one browser).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.observe.dash_app import Crawl, Flaky, Hostile, Quick
from tests.support import Proc, free_port, wait_for
from tidings import App, batch
from tidings.errors import BlockingDispatchWarning
from tidings.observability.metrics import series, summed

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
APP_SPEC = "tests.observe.dash_app:app"
MODULE = "tests.observe.dash_app"
KEY = "dashboard-test-key-0123456789abcdef"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

Spawn = Callable[..., Proc]


def env_for(url: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        TIDINGS_REDIS_URL=url,
        TIDINGS_KEY=KEY,
        TIDINGS_PREFIX=prefix,
        TIDINGS_ALLOWED_MODULES=MODULE,
        TIDINGS_RETRY_AFTER="5",
    )
    return env


def wait_http(url: str, proc: Proc, timeout_s: float = 20.0) -> None:
    def up() -> bool:
        if not proc.alive():
            raise AssertionError(f"{proc.args} exited:\n{proc.tail()}")
        try:
            return httpx.get(url, timeout=1.0).status_code < 500
        except httpx.TransportError:
            return False

    wait_for(up, timeout_s, 0.1, message=f"{url} to answer")


@pytest.fixture
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: install Debian's chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE)
    try:
        yield a
    finally:
        a.close()


def test_dashboard_pages_retry_and_escaping(
    app: App,
    redis_url: str,
    prefix: str,
    redis_client: redis.Redis,
    spawn_proc: Spawn,
    browser: object,
) -> None:
    from playwright.sync_api import Browser, expect

    assert isinstance(browser, Browser)
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    env = env_for(redis_url, prefix)
    dash_port, metrics_port = free_port(), free_port()
    dash = spawn_proc([NOTIFY_WORKER, "-A", APP_SPEC, "dashboard", "--port", str(dash_port)],
                      name="dashboard", env=env, cwd=ROOT)  # fmt: skip
    worker = spawn_proc([NOTIFY_WORKER, "-A", APP_SPEC, "--sleep", "1", "--concurrency", "4",
                         "--metrics-port", str(metrics_port)],
                        name="worker", env=env, cwd=ROOT)  # fmt: skip
    base = f"http://127.0.0.1:{dash_port}"
    wait_http(base + "/", dash)

    # Playwright's sync API keeps an event loop running on this thread: the sync
    # dispatches below would warn (once per process) that they block it, which is true
    # and harmless here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BlockingDispatchWarning)
        quick = app.dispatch_many([Quick(i) for i in range(25)])
        flaky = Flaky("a").dispatch()
        hostile = Hostile("<b>bold</b>", "hunter2-very-secret", "sk_live_0123456789").dispatch()
        batch([Quick(100 + i) for i in range(5)]).name("<i>nightly</i> import").dispatch()
    assert flaky and hostile
    rq = app.queue_for(None)
    wait_for(lambda: rq.sizes(["default"])["default"]["failed"] == 2, 20, message="2 failed")
    wait_for(lambda: app.job_status(quick[-1]) == "done", 20)
    # the banner named the queues, the masked Redis URL and the pid
    wait_for(lambda: f"pid {worker.pid}" in worker.output(), 10, message="banner")
    assert "queues:      default" in worker.output()

    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

    # queues: sizes, last-hour figures and charts
    def measured() -> int:
        return summed(series(redis_client, prefix, "default")).processed

    wait_for(lambda: measured() >= 30, 10, message="30 runs measured")
    page.goto(base + "/")
    expect(page.locator("#queues")).to_contain_text("default")
    row = page.locator("#queues tbody tr").first.inner_text()
    assert "30" in row.split() or "31" in row.split(), row
    assert page.locator("svg.chart").count() >= 3
    page.screenshot(path=str(ARTIFACTS / "queues.png"), full_page=True)

    page.goto(base + "/queues/default")
    expect(page.locator("#classes")).to_contain_text("Quick")
    page.screenshot(path=str(ARTIFACTS / "queue-classes.png"), full_page=True)

    page.goto(base + "/workers")
    expect(page.locator("#workers")).to_contain_text(str(worker.pid))
    page.screenshot(path=str(ARTIFACTS / "workers.png"), full_page=True)

    page.goto(base + "/batches")
    expect(page.locator("#batches")).to_contain_text("<i>nightly</i> import")  # escaped
    assert page.locator("#batches i").count() == 0
    page.screenshot(path=str(ARTIFACTS / "batches.png"), full_page=True)

    # failed jobs: hostile data is text, never markup or script
    page.goto(base + "/failed")
    expect(page.locator("#failed tbody tr")).to_have_count(2)
    expect(page.locator("#failed")).to_contain_text("<img src=x onerror=alert(1)>Hostile")
    assert page.locator("#main img").count() == 0
    page.screenshot(path=str(ARTIFACTS / "failed.png"), full_page=True)
    page.goto(base + "/failed?class=hostile")
    expect(page.locator("#failed tbody tr")).to_have_count(1)

    page.goto(f"{base}/failed/{hostile}")
    payload = page.locator("pre.payload").inner_text()
    assert (
        "hunter2-very-secret" not in page.content() and "sk_live_0123456789" not in page.content()
    )
    assert "[REDACTED]" in payload and "<b>bold</b>" in payload
    expect(page.locator("pre.trace")).to_contain_text("<script>alert('boom')</script>")
    assert page.locator("#main script, #main b").count() == 0
    page.screenshot(path=str(ARTIFACTS / "failed-detail.png"), full_page=True)

    # retry the flaky job from its page and see it run on the real worker
    page.goto(f"{base}/failed/{flaky}")
    expect(page.locator("pre.trace")).to_contain_text("not fixed yet")
    redis_client.set(f"{prefix}:test:fixed", "1")
    page.click("#retry-one")
    expect(page.locator("#done")).to_contain_text("retried 1")
    wait_for(lambda: redis_client.hget(f"{prefix}:test:ran", "a") == b"1", 15, message="re-run")
    # the measurement reaches Redis with the worker's next flush (at most a second later)
    wait_for(lambda: getattr(app.job_status(flaky), "outcome", None) == "processed", 10)
    page.goto(f"{base}/jobs?id={flaky}")
    expect(page.locator("#job")).to_contain_text("done")
    expect(page.locator("#job")).to_contain_text("processed")
    page.screenshot(path=str(ARTIFACTS / "job-status.png"), full_page=True)
    page.goto(base + "/failed")
    expect(page.locator("#failed tbody tr")).to_have_count(1)

    # forget the hostile one (confirm dialogs are accepted only for "all")
    page.locator(f'tr[data-id="{hostile}"] button.forget').click()
    expect(page.locator("#done")).to_contain_text("forgot 1")
    assert rq.find_failed(hostile) is None
    assert dialogs == []

    # Prometheus: the dashboard's (all workers, from Redis) and the worker's own
    text = httpx.get(base + "/metrics", timeout=5).text
    assert 'tidings_jobs_processed_total{job_class="Quick",queue="default"}' in text
    assert "tidings_workers_alive 1.0" in text
    assert 'tidings_queue_jobs{queue="default",state="failed"} 0.0' in text
    own = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    assert "tidings_job_runtime_seconds_bucket" in own and "tidings_job_wait_seconds_count" in own

    # a worker that stops disappears from the workers page
    worker.terminate()
    assert worker.wait(15) == 0
    page.goto(base + "/workers")
    expect(page.locator("#main")).to_contain_text("No live workers")
    page.close()


def test_sign_in_retry_and_sign_out(
    app: App,
    redis_url: str,
    prefix: str,
    redis_client: redis.Redis,
    spawn_proc: Spawn,
    browser: object,
) -> None:
    """Issue 29: a token-guarded dashboard in chromium: redirected to sign in, a wrong
    token refused, the right one opens the pages, Retry runs the job on a real worker,
    Sign out ends the session (the old cookie opens nothing afterwards)."""
    from playwright.sync_api import Browser, expect

    assert isinstance(browser, Browser)
    shots = ROOT / "test-artifacts" / "dashboard-auth"
    if shots.exists():
        shutil.rmtree(shots)
    shots.mkdir(parents=True)
    token = "Xq3v9KpT2rW7mZ4nB8cY1dF6gH0jL5sA-uE_oI"
    env = dict(env_for(redis_url, prefix), TIDINGS_DASHBOARD_TOKEN=token)
    port = free_port()
    dash = spawn_proc([NOTIFY_WORKER, "-A", APP_SPEC, "dashboard", "--port", str(port)],
                      name="dashboard", env=env, cwd=ROOT)  # fmt: skip
    worker = spawn_proc([NOTIFY_WORKER, "-A", APP_SPEC, "--sleep", "1"], name="worker",
                        env=env_for(redis_url, prefix), cwd=ROOT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/login", dash)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BlockingDispatchWarning)
        flaky = Flaky("auth").dispatch()
    rq = app.queue_for(None)
    wait_for(lambda: rq.find_failed(flaky) is not None, 20, message="the job failed")
    assert worker.alive()

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(base + "/failed")
    expect(page).to_have_url(base + "/login")
    page.fill("input[name=token]", "not-the-token")
    page.click("#sign-in")
    expect(page.locator("main")).to_contain_text("wrong token")
    page.screenshot(path=str(shots / "login-refused.png"), full_page=True)
    page.fill("input[name=token]", token)
    page.click("#sign-in")
    expect(page.locator("#logout")).to_be_visible()
    cookie = next(c for c in context.cookies() if c["name"] == "tidings_auth")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
    page.goto(base + "/failed")
    expect(page.locator("#failed tbody tr")).to_have_count(1)
    page.screenshot(path=str(shots / "failed-signed-in.png"), full_page=True)

    redis_client.set(f"{prefix}:test:fixed", "1")
    page.locator(f'tr[data-id="{flaky}"] button.retry').click()
    expect(page.locator("#done")).to_contain_text("retried 1 failed job")
    wait_for(lambda: redis_client.hget(f"{prefix}:test:ran", "auth") == b"1", 15,
             message="the retried job ran")  # fmt: skip
    page.screenshot(path=str(shots / "retried.png"), full_page=True)

    page.click("#logout")
    expect(page).to_have_url(base + "/login")
    page.screenshot(path=str(shots / "signed-out.png"), full_page=True)
    # The cookie from before is dead server-side, not only forgotten by the browser.
    r = httpx.get(base + "/failed", cookies={"tidings_auth": cookie["value"]},
                  headers={"Accept": "text/html"}, timeout=5)  # fmt: skip
    assert r.status_code == 303 and r.headers["location"] == "/login"
    page.goto(base + "/failed")
    expect(page).to_have_url(base + "/login")
    context.close()


def test_job_page_progress_and_cancel_of_a_running_job(
    app: App,
    redis_url: str,
    prefix: str,
    redis_client: redis.Redis,
    spawn_proc: Spawn,
    browser: object,
) -> None:
    """Issue 23: a long async job on a real worker reports progress; its page shows the
    bar, the note and when; Cancel (a real click, confirmed) cancels it in its worker:
    the handler sees CancelledError (its ``finally`` runs), ``failed()`` is not called,
    the status becomes ``cancelled``. A stale page's Cancel of a finished job says so.
    The batch page shows its running member's progress."""
    from playwright.sync_api import Browser, expect

    assert isinstance(browser, Browser)
    shots = ROOT / "test-artifacts" / "dashboard-control"
    if shots.exists():
        shutil.rmtree(shots)
    shots.mkdir(parents=True)
    env = env_for(redis_url, prefix)
    port = free_port()
    dash = spawn_proc([NOTIFY_WORKER, "-A", APP_SPEC, "dashboard", "--port", str(port)],
                      name="dashboard", env=env, cwd=ROOT)  # fmt: skip
    worker = spawn_proc([NOTIFY_WORKER, "-A", APP_SPEC, "--sleep", "1", "--concurrency", "4"],
                        name="worker", env=env, cwd=ROOT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/", dash)
    crawled = f"{prefix}:test:crawl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BlockingDispatchWarning)
        long_id = Crawl("long", steps=100_000, pause=0.05, note="page\x1b[2J").with_priority(
            30).dispatch()  # fmt: skip
        batch_id = batch([Crawl("member", steps=100_000, pause=0.05)]).name("crawl").dispatch()
    assert long_id and batch_id

    def progress_at_least(job_id: str, n: float) -> bool:
        p = getattr(app.job_status(job_id), "progress", None)
        return p is not None and p.done >= n

    wait_for(lambda: progress_at_least(long_id, 5), 30, message="the job reports progress")

    page = browser.new_page(viewport={"width": 1300, "height": 900})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.accept()))
    page.goto(f"{base}/jobs/{long_id}")
    expect(page.locator("#job-state")).to_have_text("reserved")
    expect(page.locator("#job-priority")).to_have_text("30")
    progress = page.locator("#job-progress")
    expect(progress).to_contain_text("/ 100000")
    expect(progress.locator(".note")).to_contain_text("page\\x1b[2J")  # escaped, visible
    expect(progress).to_contain_text("reported")
    assert progress.locator("progress").count() == 1
    first = float(progress.locator(".done").inner_text())
    # the live refresh (every 5 s) shows it moving on without a reload
    wait_for(lambda: float(progress.locator(".done").inner_text()) > first, 20,
             message="the page's progress moved on")  # fmt: skip
    page.screenshot(path=str(shots / "job-running.png"), full_page=True)

    page.goto(f"{base}/batches/{batch_id}")
    expect(page.locator("#members")).to_contain_text("/ 100000")
    page.screenshot(path=str(shots / "batch-running.png"), full_page=True)

    page.goto(f"{base}/jobs/{long_id}")
    t0 = time.monotonic()
    page.click("#cancel-job")
    expect(page.locator("#cancel-outcome")).to_contain_text("Cancelling")
    assert dialogs == ["Cancel this job?"]
    wait_for(lambda: redis_client.hget(crawled, "long") == b"cancelled", 10,
             message="the handler saw CancelledError")  # fmt: skip
    took = time.monotonic() - t0
    wait_for(lambda: app.job_status(long_id) == "cancelled", 10, message="status cancelled")
    page.goto(f"{base}/jobs/{long_id}")
    expect(page.locator("#job-state")).to_have_text("cancelled")
    assert page.locator("#cancel-job").count() == 0
    page.screenshot(path=str(shots / "job-cancelled.png"), full_page=True)
    print(f"click on Cancel to the handler's finally: {took:.2f}s")
    assert redis_client.hget(f"{prefix}:test:crawl-failed", "long") is None  # no failed()

    # A page opened while the job ran, clicked after it finished: nothing changes.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BlockingDispatchWarning)
        short_id = Crawl("short", steps=20, pause=0.05).dispatch()
    assert short_id
    wait_for(lambda: app.job_status(short_id) in ("reserved", "done"), 20)
    page.goto(f"{base}/jobs/{short_id}")
    if page.locator("#cancel-job").count():
        page.uncheck("#live")  # keep the stale button on the page
        wait_for(lambda: app.job_status(short_id) == "done", 20, message="short job done")
        page.click("#cancel-job")
        expect(page.locator("#cancel-outcome")).to_contain_text("Already finished (done)")
        page.screenshot(path=str(shots / "job-finished-cancel.png"), full_page=True)
    else:  # the busy machine finished it before the page loaded
        expect(page.locator("#job-state")).to_have_text("done")
    assert redis_client.hget(crawled, "short") == b"finished"

    # the batch's member too, then the batch counts it cancelled
    member = next(iter(app.queue_for(None).client.smembers(
        f"{prefix}:batch:{{{batch_id}}}:members"))).decode()  # fmt: skip
    page.goto(f"{base}/jobs/{member}")
    page.click("#cancel-job")
    expect(page.locator("#cancel-outcome")).to_contain_text("Cancelling")
    wait_for(lambda: redis_client.hget(crawled, "member") == b"cancelled", 10)
    page.goto(f"{base}/batches")
    wait_for(lambda: app.find_batch(batch_id).cancelled_jobs == 1, 10,  # type: ignore[union-attr]
             message="the batch counted its cancelled member")  # fmt: skip
    page.goto(f"{base}/batches/{batch_id}")
    expect(page.locator("#batch")).to_contain_text("cancelled jobs")
    page.screenshot(path=str(shots / "batch-after-cancel.png"), full_page=True)
    assert worker.alive(), worker.tail()
    page.close()
