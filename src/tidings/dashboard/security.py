"""Who may see the dashboard, and which requests may change state.

* **Bind.** Loopback by default. Any other address needs a token
  (``TIDINGS_DASHBOARD_TOKEN``) or basic-auth credentials (``TIDINGS_DASHBOARD_USER`` and
  ``TIDINGS_DASHBOARD_PASSWORD``); :func:`check_bind` refuses to start otherwise.
* **Auth.** With a token: ``Authorization: Bearer <token>``, or the cookie set by the
  ``/login`` form. With basic auth: the browser's prompt. Compared in constant time.
* **CSRF.** Every state change is a POST whose form carries the token of the
  ``tidings_csrf`` cookie (double submit; the cookie is ``SameSite=Strict``), and a
  present ``Origin`` header must be this host.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass

from tidings.errors import ConfigurationError

CSRF_COOKIE = "tidings_csrf"
AUTH_COOKIE = "tidings_auth"


@dataclass(frozen=True, slots=True)
class Auth:
    """The operator's credentials for the dashboard (all None: loopback only)."""

    token: str | None = None
    username: str | None = None
    password: str | None = None

    @classmethod
    def from_env(cls, token: str | None = None) -> Auth:
        """From ``TIDINGS_DASHBOARD_TOKEN`` / ``_USER`` / ``_PASSWORD`` (``token`` wins)."""
        env = os.environ
        return cls(
            token or env.get("TIDINGS_DASHBOARD_TOKEN") or None,
            env.get("TIDINGS_DASHBOARD_USER") or None,
            env.get("TIDINGS_DASHBOARD_PASSWORD") or None,
        )

    @property
    def configured(self) -> bool:
        return bool(self.token) or bool(self.username and self.password)

    def cookie_value(self) -> str:
        assert self.token
        return hmac.new(self.token.encode(), b"tidings-dashboard-login", hashlib.sha256).hexdigest()

    def allows(self, authorization: str | None, cookie: str | None) -> bool:
        """Whether a request with these headers is let in."""
        if not self.configured:
            return True
        kind, _, value = (authorization or "").partition(" ")
        if self.token:
            if kind.lower() == "bearer" and hmac.compare_digest(value.strip().encode(),
                                                                self.token.encode()):  # fmt: skip
                return True
            if cookie and hmac.compare_digest(cookie.encode(), self.cookie_value().encode()):
                return True
        if self.username and self.password and kind.lower() == "basic":
            try:
                user, _, pw = base64.b64decode(value.strip(), validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            ok_user = hmac.compare_digest(user.encode(), self.username.encode())
            ok_pw = hmac.compare_digest(pw.encode(), self.password.encode())
            return ok_user and ok_pw
        return False


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind) is loopback only."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: Auth) -> None:
    """Refuse a non-loopback bind without credentials.

    Raises:
        ConfigurationError: naming the settings that allow it.
    """
    if is_loopback(host) or auth.configured:
        return
    raise ConfigurationError(
        f"refusing to serve the dashboard on {host!r} (not loopback) without credentials: "
        "set TIDINGS_DASHBOARD_TOKEN (or --token), or TIDINGS_DASHBOARD_USER and "
        "TIDINGS_DASHBOARD_PASSWORD for basic auth"
    )


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_ok(cookie: str | None, submitted: str | None) -> bool:
    if not cookie or not submitted:
        return False
    return hmac.compare_digest(cookie.encode(), submitted.encode())
