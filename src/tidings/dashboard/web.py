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
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tidings.dashboard.charts import line_chart
from tidings.dashboard.data import Reader
from tidings.dashboard.security import (
    AUTH_COOKIE,
    CSRF_COOKIE,
    Auth,
    csrf_ok,
    new_csrf_token,
)
from tidings.observability.metrics import Counts

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


class _Guard(BaseHTTPMiddleware):
    """Auth on every request; a CSRF cookie on every response that lacks one."""

    def __init__(self, app: ASGIApp, auth: Auth) -> None:
        super().__init__(app)
        self.auth = auth

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        path, root = str(request.scope.get("path", "")), str(request.scope.get("root_path", ""))
        if root and path.startswith(root):
            path = path[len(root) :]
        if not path.startswith(("/login", "/static/")) and not self.auth.allows(
            request.headers.get("authorization"), request.cookies.get(AUTH_COOKIE)
        ):
            if self.auth.username and not self.auth.token:
                return PlainTextResponse("authentication required", 401,
                                         {"WWW-Authenticate": 'Basic realm="tidings"'})  # fmt: skip
            if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
                return RedirectResponse(_root(request) + "/login", 303)
            return PlainTextResponse("authentication required", 401,
                                     {"WWW-Authenticate": 'Bearer realm="tidings"'})  # fmt: skip
        token = request.cookies.get(CSRF_COOKIE)
        fresh = None
        if not token:
            token = fresh = new_csrf_token()
        request.state.csrf = token
        response = await call_next(request)
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'",
        )
        if fresh:
            response.set_cookie(CSRF_COOKIE, fresh, httponly=True, samesite="strict",
                                secure=request.url.scheme == "https",
                                path=_root(request) or "/")  # fmt: skip
        return response


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


class Dashboard:
    """The routes, bound to one App."""

    def __init__(self, app: Any, auth: Auth) -> None:
        self.reader = Reader(app)
        self.auth = auth
        self.env = Environment(
            loader=PackageLoader("tidings.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )
        self.env.filters.update(when=_when, ago=_ago, ms=_ms)
        self.env.globals.update(plural=_plural, quote=quote)

    def render(
        self, request: Request, template: str, status: int = 200, **ctx: Any
    ) -> HTMLResponse:
        root = _root(request)
        html = self.env.get_template(template).render(
            root=root, csrf=getattr(request.state, "csrf", ""), path=request.url.path,
            now=time.time(), **ctx,
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

    def failed(self, request: Request) -> HTMLResponse:
        cls = request.query_params.get("class", "")[:200]
        text = request.query_params.get("q", "")[:200]
        rows = self.reader.failed(cls=cls, text=text)
        done = request.query_params.get("done", "")[:100]
        return self.render(request, "failed.html", rows=rows, cls=cls, q=text, done=done)

    def failed_one(self, request: Request) -> HTMLResponse:
        detail = self.reader.failed_detail(request.path_params["job_id"])
        if detail is None:
            return self.render(request, "missing.html", 404, what="failed job",
                               job_id=request.path_params["job_id"])  # fmt: skip
        return self.render(request, "failed_one.html", d=detail)

    def batches(self, request: Request) -> HTMLResponse:
        return self.render(request, "batches.html", batches=self.reader.batches())

    def job(self, request: Request) -> Response:
        job_id = request.query_params.get("id") or request.path_params.get("job_id") or ""
        job_id = job_id.strip()[:128]
        if not job_id:
            return self.render(request, "job.html", job_id="", state=None, timing=None)
        state, timing = self.reader.job(job_id)
        return self.render(request, "job.html", job_id=job_id, state=state, timing=timing,
                           status=200 if state else 404)  # fmt: skip

    def metrics(self, request: Request) -> Response:
        from tidings.observability.prometheus import dashboard_text

        body, content_type = dashboard_text(self.reader.app)
        return Response(body, media_type=content_type)

    def login_form(self, request: Request) -> HTMLResponse:
        return self.render(request, "login.html", error="")

    async def login(self, request: Request) -> Response:
        form = await request.form()
        token = str(form.get("token", ""))
        if not self.auth.token or not self.auth.allows(f"Bearer {token}", None):
            return self.render(request, "login.html", 403, error="wrong token")
        response = RedirectResponse(_root(request) + "/", 303)
        response.set_cookie(AUTH_COOKIE, self.auth.cookie_value(), httponly=True,
                            samesite="strict", secure=request.url.scheme == "https",
                            path=_root(request) or "/")  # fmt: skip
        return response

    # -- actions (POST + CSRF) --------------------------------------------------------

    async def _form(self, request: Request) -> dict[str, str] | None:
        origin = request.headers.get("origin")
        if origin and origin != "null":
            expected = f"{request.url.scheme}://{request.headers.get('host', '')}"
            if origin != expected:
                return None
        form = await request.form()
        if not csrf_ok(request.cookies.get(CSRF_COOKIE), str(form.get("csrf", ""))):
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
        return self._back(request, form, f"retried {n}")

    async def forget(self, request: Request) -> Response:
        form = await self._form(request)
        if form is None:
            return self._refused(request)
        rq = self.reader.rq
        if form.get("all") == "1":
            n = await run_in_threadpool(rq.flush)
        else:
            n = await run_in_threadpool(rq.forget, [form.get("id", "")])
        return self._back(request, form, f"forgot {n}")

    def _back(self, request: Request, form: dict[str, str], done: str) -> Response:
        return RedirectResponse(f"{_root(request)}/failed?{urlencode({'done': done})}", 303)


def create_app(app: Any, *, auth: Auth | None = None) -> Starlette:
    """The dashboard for a tidings App, as a Starlette (ASGI) app.

    Args:
        app: the :class:`tidings.App` whose Redis the dashboard reads.
        auth: required credentials (default: from ``TIDINGS_DASHBOARD_*``; none
            configured means no auth, which ``notify-worker dashboard`` allows on
            loopback only. When you mount it yourself, guard it as you guard your admin).
    """
    auth = auth if auth is not None else Auth.from_env()
    d = Dashboard(app, auth)
    static = StaticFiles(packages=[("tidings.dashboard", "static")])
    routes = [
        Route("/", d.queues, name="queues"),
        Route("/queues/{name}", d.queue, name="queue"),
        Route("/workers", d.workers, name="workers"),
        Route("/failed", d.failed, name="failed"),
        Route("/failed/retry", d.retry, methods=["POST"]),
        Route("/failed/forget", d.forget, methods=["POST"]),
        Route("/failed/{job_id}", d.failed_one, name="failed_one"),
        Route("/batches", d.batches, name="batches"),
        Route("/jobs", d.job, name="jobs"),
        Route("/jobs/{job_id}", d.job, name="job"),
        Route("/metrics", d.metrics, name="metrics"),
        Route("/login", d.login_form, methods=["GET"]),
        Route("/login", d.login, methods=["POST"]),
        Mount("/static", static, name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(_Guard, auth=auth)])


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
