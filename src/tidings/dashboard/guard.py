"""The middleware every dashboard request passes first (a plain ASGI app).

In order, before any route runs:

1. **Host.** A ``Host`` header that is not an allowed host gets 421 (DNS rebinding: the
   attacker's page sends its own name), and so does an ``Origin`` header that is not
   one of them (``Origin: null`` included).
2. **Auth.** Everything but ``/login`` and ``/static/`` needs the credentials: a login
   session cookie, ``Authorization: Bearer``, or basic auth. Wrong credentials count
   towards the throttle; a throttled address gets 429.
3. **CSRF.** The request gets its form token (signed for its ``tidings_csrf`` nonce and
   session), and a fresh nonce cookie when it had none.

Every response, refusals and static files included, carries the security headers;
everything but static files also ``Cache-Control: no-store``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders

from tidings.dashboard.security import AllowedHosts, Auth
from tidings.dashboard.sessions import AUTH_COOKIE, CSRF_COOKIE, Csrf, LoginThrottle, Sessions

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}


@dataclass(slots=True)
class Security:
    """What the guard and the routes share: credentials, hosts, sessions, CSRF, throttle."""

    auth: Auth
    hosts: AllowedHosts
    sessions: Sessions | None
    csrf: Csrf
    throttle: LoginThrottle


def root_of(scope: Scope) -> str:
    return str(scope.get("root_path", "")).rstrip("/")


def client_of(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "?"


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _cookies(scope: Scope) -> dict[str, str]:
    raw = _header(scope, b"cookie")
    if not raw:
        return {}
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except Exception:  # a malformed cookie header is as good as none
        return {}
    return {k: m.value for k, m in jar.items()}


def cookie_header(name: str, value: str, *, path: str, secure: bool,
                  max_age: int | None = None) -> str:  # fmt: skip
    """A ``Set-Cookie`` value: HttpOnly, SameSite=Strict, ``Secure`` over https."""
    parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


async def _plain(send: Send, status: int, text: str, extra: dict[str, str] | None = None) -> None:
    body = (text + "\n").encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """Host check, auth, CSRF token and security headers for every request."""

    def __init__(self, app: ASGIApp, security: Security) -> None:
        self.app = app
        self.security = security

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        root = root_of(scope)
        path = str(scope.get("path", ""))
        if root and path.startswith(root):
            path = path[len(root) :]
        static = path.startswith("/static/")
        state: dict[str, Any] = scope.setdefault("state", {})
        fresh_cookies: list[str] = []

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for key, value in SECURITY_HEADERS.items():
                    if key not in headers:
                        headers[key] = value
                if not static:
                    headers["cache-control"] = "no-store"
                for cookie in fresh_cookies:
                    headers.append("set-cookie", cookie)
            await send(message)

        refusal = await self._refusal(scope, path)
        if refusal is not None:
            status, text, extra = refusal
            await _plain(send_with_headers, status, text, extra)
            return
        if not static:
            cookies = _cookies(scope)
            nonce = cookies.get(CSRF_COOKIE, "")
            if not nonce or len(nonce) > 100:
                nonce = self.security.csrf.new_nonce()
                secure = scope.get("scheme") == "https"
                fresh_cookies.append(cookie_header(CSRF_COOKIE, nonce, path=root or "/",
                                                   secure=secure))  # fmt: skip
            state["csrf_nonce"] = nonce
            state["csrf"] = self.security.csrf.token(nonce, state.get("session", ""))
        await self.app(scope, receive, send_with_headers)

    async def _refusal(self, scope: Scope, path: str) -> tuple[int, str, dict[str, str]] | None:
        """Why this request is refused before any route: (status, text, headers), or None."""
        sec = self.security
        if not sec.hosts.host_ok(_header(scope, b"host")):
            return 421, "unknown host: this dashboard answers only to its allowed hosts", {}
        origin = _header(scope, b"origin")
        if origin is not None and not sec.hosts.origin_ok(origin):
            return 403, "cross-origin request refused", {}
        if not sec.auth.configured:
            return None
        state: dict[str, Any] = scope["state"]
        client = client_of(scope)
        session = _cookies(scope).get(AUTH_COOKIE)
        if (
            session
            and sec.sessions is not None
            and await run_in_threadpool(sec.sessions.valid, session)
        ):
            state["session"] = session
            return None
        if path == "/login" or path.startswith("/static/"):
            return None
        verdict = sec.auth.check_header(_header(scope, b"authorization"))
        if verdict is not None:
            wait = sec.throttle.blocked_for(client)
            if wait:
                return (
                    429,
                    "too many failed logins: try again later",
                    {"retry-after": str(int(wait) + 1)},
                )
            if verdict:
                return None
            sec.throttle.failed(client)
        if sec.auth.basic:
            return 401, "authentication required", {"www-authenticate": 'Basic realm="tidings"'}
        accept = _header(scope, b"accept") or ""
        if scope.get("method") == "GET" and "text/html" in accept:
            return 303, "sign in first", {"location": root_of(scope) + "/login"}
        return 401, "authentication required", {"www-authenticate": 'Bearer realm="tidings"'}
