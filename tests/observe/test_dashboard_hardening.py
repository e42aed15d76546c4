"""Issue 29: the dashboard safe where it runs. One test (or a few) per item of the issue,
each failing on the code before it, over HTTP against the ASGI app on the test's real
Redis (httpx's ASGI transport), the real worker where a job must fail, and the CLI.

1. DNS rebinding: a foreign ``Host`` and ``Origin`` refused in every mode.
2. Tokens: weak ones refused; login cookies are random sessions with expiry and logout;
   failed logins throttled.
3. CSRF tokens signed and bound to the session; ``Origin: null`` refused.
4. Security headers on every response; ``Cache-Control: no-store`` on pages.
5. Secrets in JSON keys redacted (dashboard, ``failed show``, the failed store).
6. Outcome codes only; exceptions with ``\\r\\n`` whole; control characters escaped.
7. Pages with a cursor; a search that reaches every failed job, bounded per request.
8. ``/`` in a queue name; no CSRF cookie on static responses.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from click.testing import CliRunner

from tests.observe.dash_app import Leaky
from tidings import App
from tidings.cli.main import main as cli_main
from tidings.dashboard import Auth, check_bind, create_app
from tidings.errors import ConfigurationError

KEY = "dashboard-test-key-0123456789abcdef"
MODULE = "tests.observe.dash_app"
TOKEN = "Xq3v9KpT2rW7mZ4nB8cY1dF6gH0jL5sA-uE_oI"
LOCAL = "http://127.0.0.1:8765"
REBIND = "rebind.attacker.example:8799"


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE)
    try:
        yield a
    finally:
        a.close()


def client(asgi: Any, base_url: str = LOCAL, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=base_url, **kw)


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF field in the page"
    return m.group(1)


def plant(app: App, queue: str, job_id: str, score_ms: int, *, name: str = "app.jobs.Job",
          exception: str = "RuntimeError: boom", body: bytes = b"{}") -> None:  # fmt: skip
    """A failed record written in the failed store's real layout."""
    rq = app.queue_for(None)
    k = rq.keys(queue)
    rq.client.zadd(k.failed, {job_id: score_ms})
    info = {"name": name, "exception": exception, "attempts": 1, "queue": queue}
    rq.client.hset(k.failed_info, job_id, orjson.dumps(info))
    rq.client.hset(k.failed_body, job_id, body)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- 1. DNS rebinding --------------------------------------------------------------------


MODES = {
    "no auth": Auth(),
    "token": Auth(token=TOKEN, allowed_hosts=("ops.example.com",)),
    "basic": Auth(username="ops", password="pa55-word-long", allowed_hosts=("ops.example.com",)),
    "token, no hosts named": Auth(token=TOKEN),
}
CREDENTIALS = {
    "no auth": {},
    "token": {"Authorization": f"Bearer {TOKEN}"},
    "basic": {"Authorization": "Basic " + base64.b64encode(b"ops:pa55-word-long").decode()},
    "token, no hosts named": {"Authorization": f"Bearer {TOKEN}"},
}


@pytest.mark.parametrize("mode", list(MODES))
def test_foreign_host_and_origin_are_refused_in_every_mode(app: App, mode: str) -> None:
    plant(app, "default", "job-1", 1_700_000_000_000)
    web = create_app(app, auth=MODES[mode])
    creds = CREDENTIALS[mode]
    good = "ops.example.com" if mode in ("token", "basic") else "127.0.0.1:8765"

    async def main() -> None:
        # The attack of the issue: the page, then a forget, under the attacker's name.
        async with client(web, base_url=f"http://{REBIND}") as evil:
            page = await evil.get("/failed", headers=creds)
            assert page.status_code == 421, page.text
            assert "job-1" not in page.text and "tidings_csrf" not in evil.cookies
            assert "set-cookie" not in page.headers
            r = await evil.post("/failed/forget", data={"id": "job-1", "csrf": "x"},
                                headers={"Origin": f"http://{REBIND}", **creds})  # fmt: skip
            assert r.status_code == 421
        # The right host, a foreign or null Origin: refused before the form is read.
        async with client(web, base_url=f"http://{good}") as c:
            page = await c.get("/failed", headers=creds)
            assert page.status_code == 200, page.text
            token = csrf_of(page.text)
            for origin in (f"http://{REBIND}", "null", "http://127.0.0.1.attacker.example",
                           f"https://{good}.attacker.example"):  # fmt: skip
                r = await c.post("/failed/forget", data={"id": "job-1", "csrf": token},
                                 headers={"Origin": origin, **creds})  # fmt: skip
                assert r.status_code == 403, (origin, r.status_code)
        assert app.queue_for(None).find_failed("job-1") is not None  # nothing forgotten
        async with client(web, base_url=f"http://{good}") as c:
            token = csrf_of((await c.get("/failed", headers=creds)).text)
            scheme = "https" if mode in ("token", "basic") else "http"
            r = await c.post("/failed/forget", data={"id": "job-1", "csrf": token},
                             headers={"Origin": f"{scheme}://{good}", **creds})  # fmt: skip
            assert r.status_code == 303, r.text
        assert app.queue_for(None).find_failed("job-1") is None

    run(main())


def test_which_hosts_each_mode_answers_to(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    async def status(web: Any, host: str, creds: dict[str, str]) -> int:
        async with client(web, base_url=f"http://{host}") as c:
            return (await c.get("/", headers=creds)).status_code

    async def main() -> None:
        open_ = create_app(app, auth=Auth())
        for host in ("127.0.0.1", "127.0.0.1:8765", "[::1]:8765", "localhost:8765", "LOCALHOST"):
            assert await status(open_, host, {}) == 200, host
        for host in ("10.0.0.5:8765", "localhost.attacker.example", "127.0.0.1.nip.io",
                     "0.0.0.0:8765", "evil.example"):  # fmt: skip
            assert await status(open_, host, {}) == 421, host
        # With credentials: the named hosts only (loopback is not named here).
        named = create_app(app, auth=MODES["token"])
        bearer = CREDENTIALS["token"]
        assert await status(named, "ops.example.com", bearer) == 200
        assert await status(named, "OPS.example.com.:443", bearer) == 200
        assert await status(named, "127.0.0.1:8765", bearer) == 421
        # ... read from TIDINGS_DASHBOARD_HOSTS, comma-separated, a port if given.
        monkeypatch.setenv("TIDINGS_DASHBOARD_TOKEN", TOKEN)
        monkeypatch.setenv("TIDINGS_DASHBOARD_HOSTS", "a.example, b.example:8443")
        from_env = create_app(app)
        assert await status(from_env, "b.example:8443", bearer) == 200
        assert await status(from_env, "a.example:1234", bearer) == 200
        assert await status(from_env, "b.example:8444", bearer) == 421

    run(main())


def test_the_command_needs_named_hosts_off_loopback_and_a_strong_token() -> None:
    runner = CliRunner()
    env = {"TIDINGS_DASHBOARD_TOKEN": "", "TIDINGS_DASHBOARD_HOSTS": ""}
    done = runner.invoke(cli_main, ["dashboard", "--host", "0.0.0.0", "--token", TOKEN], env=env)
    assert done.exit_code != 0
    assert "--allowed-host" in done.output and "TIDINGS_DASHBOARD_HOSTS" in done.output
    done = runner.invoke(cli_main, ["dashboard", "--host", "0.0.0.0", "--token", "a"], env=env)
    assert done.exit_code != 0 and "secrets.token_urlsafe(32)" in done.output
    check_bind("0.0.0.0", Auth(token=TOKEN, allowed_hosts=("ops.example.com",)))
    with pytest.raises(ConfigurationError, match="not a host name"):
        Auth(token=TOKEN, allowed_hosts=("https://ops.example.com/",))


# -- 2. tokens, sessions, throttle -----------------------------------------------------------


def test_weak_or_blank_tokens_are_refused() -> None:
    for weak in (
        "a",
        "s3cret-token-value",
        "a" * 40,
        "ab" * 20,
        "passwordpasswordpasswordpassword",
    ):
        with pytest.raises(ConfigurationError) as err:
            Auth(token=weak)
        assert "secrets.token_urlsafe(32)" in str(err.value)
        assert len(weak) < 4 or weak not in str(err.value)  # the token is never quoted
    # Whitespace is no token: not configured, so a public bind is refused.
    assert not Auth(token="   \t").configured
    with pytest.raises(ConfigurationError, match="without credentials"):
        check_bind("0.0.0.0", Auth(token=" ", allowed_hosts=("ops.example.com",)))
    assert not Auth(username="ops", password="   ").configured
    assert Auth(token=f"  {TOKEN}\n").token == TOKEN


def test_login_makes_a_random_session_that_expires_and_logout_ends(app: App, prefix: str) -> None:
    web = create_app(app, auth=Auth(token=TOKEN))
    html = {"Accept": "text/html"}

    async def login(c: httpx.AsyncClient) -> str:
        token = csrf_of((await c.get("/login")).text)
        r = await c.post("/login", data={"token": f" {TOKEN} ", "csrf": token})
        assert r.status_code == 303, r.text
        assert "Max-Age=43200" in r.headers["set-cookie"]
        assert (
            "HttpOnly" in r.headers["set-cookie"] and "SameSite=Strict" in r.headers["set-cookie"]
        )
        cookie = c.cookies.get("tidings_auth")
        assert cookie
        return cookie

    async def main() -> None:
        async with client(web) as a, client(web) as b:
            first, second = await login(a), await login(b)
            assert first != second  # random, not a function of the token
            old_formula = hmac.new(TOKEN.encode(), b"tidings-dashboard-login",
                                   hashlib.sha256).hexdigest()  # fmt: skip
            assert old_formula not in (first, second)
            assert (await a.get("/workers", headers=html)).status_code == 200
            # Redis holds a digest of the session, never the cookie.
            keys = app.queue_for(None).client.keys(f"{prefix}:dashboard:session:*")
            assert len(keys) == 2 and all(first.encode() not in k for k in keys)
            ttl = app.queue_for(None).client.ttl(keys[0])
            assert 43000 < ttl <= 43200
            # A forged cookie (the old HMAC of the token) opens nothing.
            async with client(web, cookies={"tidings_auth": old_formula}) as forged:
                assert (await forged.get("/failed", headers=html)).status_code == 303
            # Sign out: the session is gone server-side, so a copy of the cookie is dead.
            page = await a.get("/workers", headers=html)
            assert 'id="logout"' in page.text
            r = await a.post("/logout", data={"csrf": csrf_of(page.text)})
            assert r.status_code == 303 and r.headers["location"] == "/login"
            async with client(web, cookies={"tidings_auth": first}) as copy:
                assert (await copy.get("/failed", headers=html)).status_code == 303
            assert (await b.get("/failed", headers=html)).status_code == 200  # b still in
        # A new token ends the sessions of the old one.
        rotated = create_app(app, auth=Auth(token=TOKEN[::-1]))
        async with client(rotated, cookies={"tidings_auth": second}) as c:
            assert (await c.get("/failed", headers=html)).status_code == 303

    run(main())


def test_failed_logins_are_throttled(app: App) -> None:
    web = create_app(app, auth=Auth(token=TOKEN))

    async def main() -> None:
        async with client(web) as c:
            token = csrf_of((await c.get("/login")).text)
            codes = [
                (await c.post("/login", data={"token": f"guess-{i}", "csrf": token})).status_code
                for i in range(30)
            ]
            assert codes[:10] == [403] * 10 and set(codes[10:]) == {429}, codes
            r = await c.post("/login", data={"token": TOKEN, "csrf": token})
            assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
            # Guessing through the header is the same guessing.
            r = await c.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 429
        async with client(web, base_url="http://localhost:8765") as other:
            r = await other.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code in (200, 429)  # ASGI clients share an address here

    run(main())


# -- 3. CSRF ---------------------------------------------------------------------------------


def test_csrf_tokens_are_signed_and_bound_to_the_session(app: App) -> None:
    plant(app, "default", "job-1", 1_700_000_000_000)
    web = create_app(app, auth=Auth())
    tokened = create_app(app, auth=Auth(token=TOKEN))

    async def main() -> None:
        # A pair the client chose itself (the old double submit accepted it).
        async with client(web, cookies={"tidings_csrf": "abc"}) as c:
            r = await c.post("/failed/forget", data={"id": "job-1", "csrf": "abc"})
            assert r.status_code == 403
            r = await c.post("/failed/forget", data={"id": "job-1", "csrf": "abc"},
                             headers={"Origin": "null"})  # fmt: skip
            assert r.status_code == 403
        assert app.queue_for(None).find_failed("job-1") is not None
        # Bound to the session: A's form token does not work in B's session, even with
        # A's CSRF cookie copied over.
        async with client(tokened) as a, client(tokened) as b:
            for c in (a, b):
                t = csrf_of((await c.get("/login")).text)
                assert (await c.post("/login", data={"token": TOKEN, "csrf": t})).status_code == 303
            a_token = csrf_of((await a.get("/failed")).text)
            b.cookies.set("tidings_csrf", a.cookies["tidings_csrf"])
            r = await b.post("/failed/forget", data={"id": "job-1", "csrf": a_token})
            assert r.status_code == 403
            assert app.queue_for(None).find_failed("job-1") is not None
            r = await a.post("/failed/forget", data={"id": "job-1", "csrf": a_token})
            assert r.status_code == 303
        assert app.queue_for(None).find_failed("job-1") is None

    run(main())


# -- 4. headers ------------------------------------------------------------------------------


def test_every_response_has_the_security_headers(app: App) -> None:
    web = create_app(app, auth=Auth(token=TOKEN))
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    async def main() -> None:
        async with client(web) as c:
            responses = {
                "401": await c.get("/failed"),
                "303 to /login": await c.get("/failed", headers={"Accept": "text/html"}),
                "login": await c.get("/login"),
                "421": await c.get("/", headers={"Host": REBIND}),
                "page": await c.get("/failed", headers=bearer),
                "404": await c.get("/failed/no-such-id", headers=bearer),
                "metrics": await c.get("/metrics", headers=bearer),
                "static": await c.get("/static/dashboard.css"),
            }
        assert responses["303 to /login"].status_code == 303
        for what, r in responses.items():
            assert r.headers["content-security-policy"].startswith("default-src 'self'"), what
            assert r.headers["x-frame-options"] == "DENY", what
            assert r.headers["x-content-type-options"] == "nosniff", what
            if what != "static":
                assert r.headers["cache-control"] == "no-store", what

    run(main())


# -- 5. secrets in JSON keys -------------------------------------------------------------------


def test_secrets_in_json_keys_are_redacted_everywhere(
    app: App, redis_url: str, prefix: str
) -> None:
    import tidings.worker.worker as w

    job_id = Leaky({"https://bob:s3cr3tpw@h/": "v", KEY: "the key as a key"}).dispatch()
    assert job_id
    asyncio.run(w.Worker(app, w.WorkerOptions(stop_when_empty=True, sleep_s=0.2)).run())
    assert app.job_status(job_id) == "failed"
    leaks = ("s3cr3tpw", KEY)
    # the failed store's exception text
    record = app.queue_for(None).find_failed(job_id)
    assert record is not None and "bad headers" in record.exception
    assert not [s for s in leaks if s in record.exception]

    async def page() -> str:
        async with client(create_app(app, auth=Auth())) as c:
            r = await c.get(f"/failed/{job_id}")
            assert r.status_code == 200
            return r.text

    shown = run(page())
    assert "https://[REDACTED]h/" in shown
    assert not [s for s in leaks if s in shown]
    env = {"TIDINGS_REDIS_URL": redis_url, "TIDINGS_KEY": KEY, "TIDINGS_PREFIX": prefix,
           "TIDINGS_ALLOWED_MODULES": MODULE, "TIDINGS_APP": ""}  # fmt: skip
    out = CliRunner().invoke(cli_main, ["failed", "show", job_id], env=env)
    assert out.exit_code == 0, out.output
    assert "bad headers" in out.output and "[REDACTED]" in out.output
    assert not [s for s in leaks if s in out.output]
    # Keys that redact alike stay two entries.
    from tidings.observability.redaction import redact_json

    both = redact_json({"https://a:pw-one@h/": 1, "https://b:pw-two@h/": 2})
    assert both == {"https://[REDACTED]h/": 1, "https://[REDACTED]h/ (2)": 2}


# -- 6. outcome codes, whole exceptions, control characters --------------------------------------


def test_outcomes_are_codes_and_text_is_whole_and_escaped(app: App) -> None:
    trace = ("Traceback (most recent call last):\n  File \"/srv/app/jobs.py\", line 3, in handle\n"
             "    raise ValueError(msg)\nValueError: first part\r\nSecond part \x1b[2J\x00 "
             "gnp.\u202eexe\n")  # fmt: skip
    plant(app, "default", "job-ctl", 1_700_000_000_000, name="Evil\x1b]52;c;aGk=\x07\u202eName",
          exception=trace)  # fmt: skip
    web = create_app(app, auth=Auth())

    async def main() -> None:
        async with client(web) as c:
            spoof = await c.get("/failed", params={"done": "your account was deleted"})
            assert "your account was deleted" not in spoof.text and 'id="done"' not in spoof.text
            done = await c.get("/failed", params={"done": "retried", "n": "3"})
            assert "Done: retried 3 failed jobs." in done.text
            odd = await c.get("/failed", params={"done": "retried", "n": "<b>9</b>"})
            assert "Done: retried 0 failed jobs." in odd.text
            page = await c.get("/failed")
            detail = await c.get("/failed/job-ctl")
        for text in (page.text, detail.text):
            assert not {"\x1b", "\x00", "\x07", "\u202e", "\r"} & set(text)
            assert "\\x1b]52;c;aGk=\\x07\\u202eName" in text  # visible, as the CLI shows it
        row = re.search(r'<td class="err">([^<]*)</td>', page.text)
        assert row, page.text
        assert row.group(1) == ("ValueError: first part\\x0d\\x0aSecond part \\x1b[2J\\x00 "
                                "gnp.\\u202eexe")  # fmt: skip

    run(main())


# -- 7. pages and search ----------------------------------------------------------------------


def test_pages_follow_the_store_order_and_search_reaches_every_job(app: App) -> None:
    from tidings.dashboard.data import FAILED_PAGE, FAILED_SCAN, Reader, decode_cursor

    base = 1_700_000_000_000
    expected: list[tuple[int, str, str]] = []
    n = FAILED_SCAN + 700
    for i in range(n):
        queue = "default" if i % 3 else "mail"
        score = base + i // 4  # four records a millisecond: ties across and within queues
        job_id = f"id-{i:05d}"
        text = "needle in the oldest" if i == 0 else f"RuntimeError: boom {i}"
        plant(app, queue, job_id, score, exception=text)
        expected.append((score, queue, job_id))
    expected.sort(reverse=True)
    reader = Reader(app)

    seen: list[str] = []
    after = ""
    pages = 0
    while True:
        page = reader.failed_page(after=after)
        assert page.total in (n, n - 1)
        assert len(page.rows) <= FAILED_PAGE and page.scanned <= FAILED_PAGE
        seen += [r.id for r in page.rows]
        pages += 1
        if pages == 3:
            # The entry the cursor names is forgotten meanwhile: the next page still
            # starts right after it.
            cursor = decode_cursor(page.next)
            assert cursor is not None
            assert app.queue_for(None).forget([cursor.id.decode()]) == 1
        if not page.next:
            break
        after = page.next
    # every record once, in the store's order (the forgotten one was shown before)
    assert seen == [e[2] for e in expected]
    assert pages == -(-n // FAILED_PAGE)

    # A search bounded per request that can continue to the oldest job.
    first = reader.failed_page(text="NEEDLE")
    assert first.rows == [] and first.scanned == FAILED_SCAN and first.next
    second = reader.failed_page(text="needle", after=first.next)
    assert [r.id for r in second.rows] == ["id-00000"] and not second.next
    assert second.scanned <= FAILED_SCAN

    async def main() -> None:
        async with client(create_app(app, auth=Auth())) as c:
            r = await c.get("/failed", params={"q": "needle"})
            assert 'id="older"' in r.text and "not yet the older ones" in r.text
            link = re.search(r'id="older" href="([^"]+)"', r.text)
            assert link
            r = await c.get(link.group(1).replace("&amp;", "&"))
            assert 'data-id="id-00000"' in r.text and 'id="older"' not in r.text

    run(main())


# -- 8. "/" in queue names, static cookies --------------------------------------------------------


def test_queue_names_with_a_slash_and_static_responses(app: App) -> None:
    plant(app, "team/a", "job/1", 1_700_000_000_000, name="SlashJob")
    web = create_app(app, auth=Auth())

    async def main() -> None:
        async with client(web) as c:
            home = await c.get("/")
            assert 'href="/queues/team%2Fa"' in home.text
            r = await c.get("/queues/team%2Fa")
            assert r.status_code == 200 and "team/a" in r.text
            failed = await c.get("/failed")
            assert 'href="/failed/job%2F1"' in failed.text
            r = await c.get("/failed/job%2F1")
            assert r.status_code == 200 and "SlashJob" in r.text
        async with client(web) as fresh:
            css = await fresh.get("/static/dashboard.css")
            assert css.status_code == 200
            assert "set-cookie" not in css.headers  # before: tidings_csrf with Path=/static

    run(main())
