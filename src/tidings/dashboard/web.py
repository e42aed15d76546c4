"""The dashboard's routes (see :mod:`tidings.dashboard`)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tidings.dashboard.charts import line_chart
from tidings.dashboard.data import FAILED_PAGE, Reader
from tidings.dashboard.guard import Guard, Security, client_of, cookie_header, root_of
from tidings.dashboard.security import AllowedHosts, Auth
from tidings.dashboard.sessions import (
    AUTH_COOKIE,
    CSRF_COOKIE,
    SESSION_TTL_S,
    Csrf,
    LoginThrottle,
    Sessions,
    server_secret,
)
from tidings.errors import ValidationError
from tidings.observability.metrics import Counts
from tidings.observability.terminal import escape
from tidings.wire.signing import parse_keys

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _when(ts: float | None) -> str:
    if not ts:
        return "—"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(ts: float | None) -> str:
    if not ts:
        return "—"
    s = max(0.0, time.time() - ts)
    if s < 60:
        return f"{s:.0f}s ago"
    if s < 3600:
        return f"{s / 60:.0f}m ago"
    return f"{s / 3600:.1f}h ago"


def _ms(v: float | None) -> str:
    if v is None:
        return "—"
    if v == float("inf"):
        return "> 60 s"
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    return f"{v:.1f} ms"


def _plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else (words or word + 's')}"


def _charts(title: str, points: list[tuple[int, Counts]]) -> list[Markup]:
    minutes = [m for m, _ in points]
    done = [float(c.processed) for _, c in points]
    failed = [float(c.failed) for _, c in points]
    released = [float(c.released) for _, c in points]
    run = [c.runtime_avg_ms for _, c in points]
    run95 = [c.percentile_ms(0.95) for _, c in points]
    wait = [c.wait_avg_ms for _, c in points]
    wait95 = [c.percentile_ms(0.95, wait=True) for _, c in points]

    def finite(vs: list[float | None]) -> list[float | None]:
        return [None if v is None or v == float("inf") else v for v in vs]

    return [
        line_chart(f"{title}: jobs / minute", minutes,
                   [("processed", done), ("failed", failed), ("released", released)]),
        line_chart(f"{title}: runtime", minutes, [("avg", run), ("p95 ≤", finite(run95))],
                   unit=" ms"),
        line_chart(f"{title}: wait (dispatch → start)", minutes,
                   [("avg", wait), ("p95 ≤", finite(wait95))], unit=" ms"),
    ]  # fmt: skip


def _root(request: Request) -> str:
    return root_of(request.scope)


def _finalize(value: Any) -> Any:
    """Every value a template prints: control and bidi characters made visible (ESC,
    NUL, U+202E...), as the CLI prints them; line breaks and tabs kept for tracebacks."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return escape(value, multiline=True)
    return value


#: What a finished action may report on the failed page: a code, never free text.
OUTCOMES = {"retried": "retried", "forgot": "forgot"}
GROUP_OUTCOMES = {"pause": "paused", "resume": "resumed", "paused": "paused",
                  "resumed": "resumed"}  # fmt: skip

#: What the job page says after its Cancel button: a code in the URL, this text shown.
CANCEL_OUTCOMES = {
    "cancelled": "Cancelled: the job was waiting and will never run.",
    "cancelling": "Cancelling: the job is running and its worker was told to stop it.",
    "done": "Already finished (done): nothing changed.",
    "failed": "Already finished (failed): nothing changed.",
    "already": "Already cancelled: nothing changed.",
    "failing": "Too late: its run failed and the failure is being recorded; nothing changed.",
    "missing": "No such job: no queue knows this id.",
    "unavailable": "Redis could not be reached: nothing was cancelled. Try again.",
}
_CANCEL_CODES = {"cancelled": "cancelled", "cancelling": "cancelling", "done": "done",
                 "failed": "failed", "cancelled already": "already",
                 "failing": "failing"}  # fmt: skip


class Dashboard:
    """The routes, bound to one App."""

    def __init__(self, app: Any, auth: Auth) -> None:
        self.reader = Reader(app)
        self.auth = auth
        secret = server_secret(parse_keys(app.settings.key)[0])
        sessions = (
            Sessions(self.reader.client, self.reader.prefix, secret, auth.token)
            if auth.token
            else None
        )
        self.security = Security(auth, AllowedHosts.of(auth), sessions, Csrf(secret),
                                 LoginThrottle())  # fmt: skip
        self.env = Environment(
            loader=PackageLoader("tidings.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            finalize=_finalize,
        )
        self.env.filters.update(when=_when, ago=_ago, ms=_ms)
        self.env.globals.update(plural=_plural, quote=quote)

    def render(
        self, request: Request, template: str, status: int = 200, **ctx: Any
    ) -> HTMLResponse:
        root = _root(request)
        state = request.scope.get("state", {})
        html = self.env.get_template(template).render(
            root=root, csrf=state.get("csrf", ""), path=request.url.path, now=time.time(),
            signed_in=bool(state.get("session")), **ctx,
        )  # fmt: skip
        return HTMLResponse(html, status)

    # -- pages ----------------------------------------------------------------------

    def queues(self, request: Request) -> HTMLResponse:
        rows = self.reader.queues()
        charts = {r.name: _charts(r.name, r.points) for r in rows}
        return self.render(request, "queues.html", rows=rows, charts=charts)

    def queue(self, request: Request) -> HTMLResponse:
        name = request.path_params["name"]
        classes = self.reader.classes(name)
        charts = {cls: _charts(cls, points) for cls, _, points in classes}
        return self.render(request, "queue.html", name=name, classes=classes, charts=charts)

    def workers(self, request: Request) -> HTMLResponse:
        return self.render(request, "workers.html", workers=self.reader.workers())

    def pools(self, request: Request) -> HTMLResponse:
        samples, decisions = self.reader.pools()
        names: list[str] = []
        for s in samples:
            for name in s.get("processes", {}) if isinstance(s.get("processes"), dict) else {}:
                if name not in names:
                    names.append(str(name))
        # One point a minute over the last hour: the most processes seen in that minute.
        last = int(time.time() // 60)
        minutes = list(range(last - 59, last + 1))
        per: dict[str, list[float | None]] = {n: [None] * 60 for n in names}
        for s in samples:
            procs = s.get("processes")
            at = s.get("at")
            if not isinstance(procs, dict) or not isinstance(at, int | float):
                continue
            i = int(at // 60) - minutes[0]
            if not 0 <= i < 60:
                continue
            for n in names:
                v = procs.get(n)
                if isinstance(v, int | float):
                    cur = per[n][i]
                    per[n][i] = float(v) if cur is None else max(cur, float(v))
        chart = line_chart("processes per pool (most in each minute)", minutes,
                           [(n, per[n]) for n in names]) if names else None  # fmt: skip
        latest = samples[0] if samples else None
        shown = [
            {"at": d.get("at") if isinstance(d.get("at"), int | float) else None,
             "reasons": [str(r) for r in d.get("reasons", []) if isinstance(r, str)][:20]}
            for d in decisions[:100]
        ]  # fmt: skip
        return self.render(request, "pools.html", chart=chart, latest=latest, names=names,
                           decisions=shown)  # fmt: skip

    def failed(self, request: Request) -> HTMLResponse:
        q = request.query_params
        cls, text = q.get("class", "")[:200], q.get("q", "")[:200]
        after = q.get("after", "")[:1200]
        page = self.reader.failed_page(cls=cls, text=text, after=after, limit=FAILED_PAGE)
        done = OUTCOMES.get(q.get("done", ""), "")
        count = q.get("n", "")
        n = int(count) if done and count.isdigit() and len(count) <= 9 else 0
        more = urlencode({k: v for k, v in (("class", cls), ("q", text), ("after", page.next))
                          if v})  # fmt: skip
        return self.render(request, "failed.html", page=page, rows=page.rows, cls=cls, q=text,
                           after=after, done=done, done_n=n, more=more)  # fmt: skip

    def failed_one(self, request: Request) -> HTMLResponse:
        detail = self.reader.failed_detail(request.path_params["job_id"])
        if detail is None:
            return self.render(request, "missing.html", 404, what="failed job",
                               job_id=request.path_params["job_id"])  # fmt: skip
        return self.render(request, "failed_one.html", d=detail)

    def batches(self, request: Request) -> HTMLResponse:
        return self.render(request, "batches.html", batches=self.reader.batches())

    def groups(self, request: Request) -> HTMLResponse:
        q = request.query_params
        queue = q.get("queue", "default")[:200] or "default"
        try:
            rows = self.reader.app.groups.list(queue=queue, top=50)
        except ValidationError:
            rows = []
        done = GROUP_OUTCOMES.get(q.get("done", ""), "")
        return self.render(request, "groups.html", rows=rows, queue=queue, done=done,
                           group=q.get("g", "")[:300] if done else "")  # fmt: skip

    def batch(self, request: Request) -> HTMLResponse:
        batch_id = request.path_params["batch_id"][:128]
        view = self.reader.batch(batch_id)
        if view is None:
            return self.render(request, "missing.html", 404, what="batch", job_id=batch_id)
        return self.render(request, "batch.html", b=view.info, view=view)

    def job(self, request: Request) -> Response:
        job_id = request.query_params.get("id") or request.path_params.get("job_id") or ""
        job_id = job_id.strip()[:128]
        said = CANCEL_OUTCOMES.get(request.query_params.get("cancel", ""), "")
        if not job_id:
            return self.render(request, "job.html", job_id="", job=None, said=said)
        view = self.reader.job(job_id)
        return self.render(request, "job.html", job_id=job_id, job=view, said=said,
                           status=200 if view else 404)  # fmt: skip

    def metrics(self, request: Request) -> Response:
        from tidings.observability.prometheus import dashboard_text

        body, content_type = dashboard_text(self.reader.app)
        return Response(body, media_type=content_type)

    def login_form(self, request: Request) -> HTMLResponse:
        return self.render(request, "login.html", error="", basic=self.auth.basic)

    async def login(self, request: Request) -> Response:
        sec = self.security
        client = client_of(request.scope)
        wait = sec.throttle.blocked_for(client)
        if wait:
            page = self.render(request, "login.html", 429, basic=self.auth.basic,
                               error="too many failed sign-ins: try again in a minute")  # fmt: skip
            page.headers["retry-after"] = str(int(wait) + 1)
            return page
        form = await self._form(request)
        if form is None:
            return self._refused(request)
        if sec.sessions is None or not self.auth.check_token_text(form.get("token", "")):
            sec.throttle.failed(client)
            return self.render(request, "login.html", 403, error="wrong token",
                               basic=self.auth.basic)  # fmt: skip
        session = await run_in_threadpool(sec.sessions.create)
        response = RedirectResponse(_root(request) + "/", 303)
        response.headers.append("set-cookie", cookie_header(
            AUTH_COOKIE, session, path=_root(request) or "/", max_age=SESSION_TTL_S,
            secure=request.url.scheme == "https"))  # fmt: skip
        return response

    async def logout(self, request: Request) -> Response:
        form = await self._form(request)
        if form is None:
            return self._refused(request)
        session = request.cookies.get(AUTH_COOKIE)
        if session and self.security.sessions is not None:
            await run_in_threadpool(self.security.sessions.end, session)
        response = RedirectResponse(_root(request) + "/login", 303)
        for name in (AUTH_COOKIE, CSRF_COOKIE):
            response.headers.append("set-cookie", cookie_header(
                name, "", path=_root(request) or "/", max_age=0,
                secure=request.url.scheme == "https"))  # fmt: skip
        return response

    # -- actions (POST + CSRF) --------------------------------------------------------

    async def _form(self, request: Request) -> dict[str, str] | None:
        """The form of a state-changing request, or None when its CSRF token is not the
        one signed for this browser's cookie and session (the guard already refused a
        foreign or ``null`` Origin)."""
        form = await request.form()
        state = request.scope.get("state", {})
        if not self.security.csrf.check(request.cookies.get(CSRF_COOKIE),
                                        state.get("session", ""),
                                        str(form.get("csrf", ""))):  # fmt: skip
            return None
        return {k: str(v) for k, v in form.items()}

    def _refused(self, request: Request) -> HTMLResponse:
        return self.render(request, "refused.html", 403)

    async def retry(self, request: Request) -> Response:
        form = await self._form(request)
        if form is None:
            return self._refused(request)
        rq = self.reader.rq
        ids = None if form.get("all") == "1" else [form.get("id", "")]
        n = await run_in_threadpool(rq.retry, ids)
        return self._back(request, "retried", n)

    async def forget(self, request: Request) -> Response:
        form = await self._form(request)
        if form is None:
            return self._refused(request)
        rq = self.reader.rq
        if form.get("all") == "1":
            n = await run_in_threadpool(rq.flush)
        else:
            n = await run_in_threadpool(rq.forget, [form.get("id", "")])
        return self._back(request, "forgot", n)

    async def group_action(self, request: Request) -> Response:
        """Pause or resume one fair group (POST + CSRF, as every action)."""
        form = await self._form(request)
        if form is None:
            return self._refused(request)
        what = request.path_params["what"]
        if what not in ("pause", "resume"):
            return self.render(request, "missing.html", 404, what="action", job_id=what)
        name, queue = form.get("group", ""), form.get("queue", "default") or "default"
        groups = self.reader.app.groups
        fn = groups.pause if what == "pause" else groups.resume
        try:
            await run_in_threadpool(lambda: fn(name, queue=queue))
        except ValidationError:
            return self.render(request, "missing.html", 400, what="group", job_id=name)
        query = urlencode({"queue": queue, "done": GROUP_OUTCOMES[what], "g": name})
        return RedirectResponse(f"{_root(request)}/groups?{query}", 303)

    async def cancel(self, request: Request) -> Response:
        """The job page's Cancel button: the move ``app.cancel`` makes, on every queue
        the dashboard knows; the answer is a code shown on the job's page."""
        from tidings.errors import JobNotFound, QueueUnavailable
        from tidings.moves.control import cancel

        form = await self._form(request)
        if form is None:
            return self._refused(request)
        job_id = form.get("id", "").strip()[:128]
        rq = self.reader.rq
        try:
            queues = await run_in_threadpool(self.reader.queue_names)
            outcome = await run_in_threadpool(cancel, rq, job_id, queues)
            code = _CANCEL_CODES.get(str(outcome), "missing")
        except JobNotFound:
            code = "missing"
        except QueueUnavailable:
            code = "unavailable"
        query = urlencode({"id": job_id, "cancel": code})
        return RedirectResponse(f"{_root(request)}/jobs?{query}", 303)

    def _back(self, request: Request, outcome: str, n: int) -> Response:
        query = urlencode({"done": outcome, "n": n})
        return RedirectResponse(f"{_root(request)}/failed?{query}", 303)


def create_app(app: Any, *, auth: Auth | None = None) -> Starlette:
    """The dashboard for a tidings App, as a Starlette (ASGI) app.

    Args:
        app: the :class:`tidings.App` whose Redis the dashboard reads.
        auth: required credentials and the host names the dashboard answers to
            (default: from ``TIDINGS_DASHBOARD_*``). No credentials means no auth, which
            ``notify-worker dashboard`` allows on loopback only; the dashboard then
            answers only to loopback host names and the ``allowed_hosts`` given. When
            you mount it yourself, guard it as you guard your admin, and name its hosts.

    Raises:
        ConfigurationError: a weak token, or a malformed allowed host.
    """
    auth = auth if auth is not None else Auth.from_env()
    d = Dashboard(app, auth)
    static = StaticFiles(packages=[("tidings.dashboard", "static")])
    routes = [
        Route("/", d.queues, name="queues"),
        # ``:path``: a queue name or job id may hold "/" (linked as %2F, which the
        # server decodes before routing).
        Route("/queues/{name:path}", d.queue, name="queue"),
        Route("/workers", d.workers, name="workers"),
        Route("/pools", d.pools, name="pools"),
        Route("/failed", d.failed, name="failed"),
        Route("/failed/retry", d.retry, methods=["POST"]),
        Route("/failed/forget", d.forget, methods=["POST"]),
        Route("/failed/{job_id:path}", d.failed_one, name="failed_one"),
        Route("/batches", d.batches, name="batches"),
        Route("/groups", d.groups, name="groups"),
        Route("/groups/{what:str}", d.group_action, methods=["POST"]),
        Route("/batches/{batch_id:path}", d.batch, name="batch"),
        Route("/jobs", d.job, name="jobs"),
        Route("/jobs/cancel", d.cancel, methods=["POST"]),
        Route("/jobs/{job_id:path}", d.job, name="job"),
        Route("/metrics", d.metrics, name="metrics"),
        Route("/login", d.login_form, methods=["GET"]),
        Route("/login", d.login, methods=["POST"]),
        Route("/logout", d.logout, methods=["POST"]),
        Mount("/static", static, name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Guard, security=d.security)])


class PrefixDispatcher:
    """Serve the dashboard under ``prefix`` beside another ASGI app (e.g. Django's)::

    application = PrefixDispatcher(create_app(tidings_app), get_asgi_application(),
                                    prefix="/tidings")
    """

    def __init__(self, dashboard: ASGIApp, other: ASGIApp, prefix: str = "/tidings") -> None:
        self.dashboard = dashboard
        self.other = other
        self.prefix = "/" + prefix.strip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] in ("http", "websocket") and (
            path == self.prefix or path.startswith(self.prefix + "/")
        ):
            scope = dict(scope)
            scope["root_path"] = scope.get("root_path", "") + self.prefix
            scope["path"] = path if path != self.prefix else self.prefix + "/"
            await self.dashboard(scope, receive, send)
        else:
            await self.other(scope, receive, send)
