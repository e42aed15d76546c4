"""Who may see the dashboard: credentials, the hosts it answers to, the bind check.

* **Bind.** Loopback by default. Any other address needs a token
  (``TIDINGS_DASHBOARD_TOKEN``) or basic-auth credentials (``TIDINGS_DASHBOARD_USER`` and
  ``TIDINGS_DASHBOARD_PASSWORD``) *and* the host names it is reached by
  (``TIDINGS_DASHBOARD_HOSTS`` / ``--allowed-host``); :func:`check_bind` refuses to
  start otherwise.
* **Tokens** are at least :data:`MIN_TOKEN_CHARS` characters with some variety
  (:func:`check_token`): a token is the only thing between the network and the failed
  store, and a short one falls to guessing.
* **Hosts** (DNS rebinding). A page on ``attacker.example`` whose name the attacker
  re-points at 127.0.0.1 reaches a loopback dashboard *with the attacker's name in the
  Host header*. So :class:`AllowedHosts` answers only to loopback names when no
  credentials are set, and only to the names the operator gave when they are (loopback
  names when none were given). ``Origin`` is compared with the same list, never with
  the request's own ``Host``.

Sessions, CSRF tokens and the login throttle are in :mod:`tidings.dashboard.sessions`;
the middleware that applies all of it to every request is :mod:`tidings.dashboard.guard`.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tidings.errors import ConfigurationError

__all__ = [
    "LOOPBACK_HOSTS",
    "MIN_TOKEN_CHARS",
    "AllowedHosts",
    "Auth",
    "check_bind",
    "check_token",
    "is_loopback",
]

#: Shortest dashboard token accepted.
MIN_TOKEN_CHARS = 32
#: Fewest different characters in a token ("a" * 32 is 32 characters and no secret).
MIN_TOKEN_DISTINCT = 10
#: Least entropy, in bits, of a token's characters taken as independent draws from their
#: own frequencies (rough, but "abababab…" and "password" repeated fall below it).
MIN_TOKEN_BITS = 96.0
MAKE_TOKEN = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'

#: Host names that can only mean this machine (a DNS-rebinding page sends its own name).
LOOPBACK_HOSTS = ("127.0.0.1", "[::1]", "localhost")


def _shannon_bits(text: str) -> float:
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values()) * n


def check_token(token: str) -> None:
    """Refuse a token too short or too uniform to be a secret.

    Raises:
        ConfigurationError: saying what is wrong and how to make a good one (the token
            itself is never quoted).
    """
    problem = ""
    if len(token) < MIN_TOKEN_CHARS:
        problem = f"it has {len(token)} characters, at least {MIN_TOKEN_CHARS} are needed"
    elif len(set(token)) < MIN_TOKEN_DISTINCT or _shannon_bits(token) < MIN_TOKEN_BITS:
        problem = "it repeats too few different characters to be a secret"
    if problem:
        raise ConfigurationError(
            f"refusing the dashboard token (TIDINGS_DASHBOARD_TOKEN or --token): {problem}. "
            f"Make a random one with: {MAKE_TOKEN}"
        )


def _set(value: str | None) -> str | None:
    """``value`` without surrounding whitespace, None when nothing is left."""
    value = (value or "").strip()
    return value or None


def _split_hosts(spec: str | Iterable[str] | None) -> tuple[str, ...]:
    items = spec.split(",") if isinstance(spec, str) else list(spec or ())
    return tuple(h.strip() for h in items if h and h.strip())


@dataclass(frozen=True, slots=True)
class Auth:
    """The operator's credentials for the dashboard, and the host names it is reached by.

    All credentials None: no auth, which :func:`check_bind` allows on loopback only and
    the dashboard answers to loopback host names only. Values are stripped; a token is
    checked with :func:`check_token`.
    """

    token: str | None = None
    username: str | None = None
    password: str | None = None
    allowed_hosts: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "token", _set(self.token))
        object.__setattr__(self, "username", _set(self.username))
        if _set(self.password) is None:
            object.__setattr__(self, "password", None)
        object.__setattr__(self, "allowed_hosts", _split_hosts(self.allowed_hosts))
        if self.token is not None:
            check_token(self.token)
        for host in self.allowed_hosts:
            if parse_host(host) is None:
                raise ConfigurationError(
                    f"not a host name for TIDINGS_DASHBOARD_HOSTS / --allowed-host: {host!r} "
                    "(give names such as ops.example.com or ops.example.com:8443)"
                )

    @classmethod
    def from_env(cls, token: str | None = None, hosts: Iterable[str] = ()) -> Auth:
        """From ``TIDINGS_DASHBOARD_TOKEN`` / ``_USER`` / ``_PASSWORD`` / ``_HOSTS``
        (``token`` and ``hosts`` win)."""
        env = os.environ
        return cls(
            token or env.get("TIDINGS_DASHBOARD_TOKEN"),
            env.get("TIDINGS_DASHBOARD_USER"),
            env.get("TIDINGS_DASHBOARD_PASSWORD"),
            _split_hosts(tuple(hosts)) or _split_hosts(env.get("TIDINGS_DASHBOARD_HOSTS")),
        )

    @property
    def configured(self) -> bool:
        return bool(self.token) or bool(self.username and self.password)

    @property
    def basic(self) -> bool:
        """Whether credentials come from the browser's basic-auth prompt (no token)."""
        return not self.token and bool(self.username and self.password)

    def check_header(self, authorization: str | None) -> bool | None:
        """Whether an ``Authorization`` header holds the credentials (None: no header)."""
        if not authorization:
            return None
        kind, _, value = authorization.partition(" ")
        kind, value = kind.lower(), value.strip()
        if self.token and kind == "bearer":
            return hmac.compare_digest(value.encode(), self.token.encode())
        if self.username and self.password and kind == "basic":
            try:
                user, _, pw = base64.b64decode(value, validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            ok_user = hmac.compare_digest(user.encode(), self.username.encode())
            ok_pw = hmac.compare_digest(pw.encode(), self.password.encode())
            return ok_user and ok_pw
        return False

    def check_token_text(self, submitted: str) -> bool:
        """Whether a token typed into the login form is the token."""
        if not self.token:
            return False
        return hmac.compare_digest(submitted.strip().encode(), self.token.encode())


def parse_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header or an allowed-host entry; None if malformed.

    Names are lower-cased without a trailing dot; IPv6 addresses keep their brackets.
    """
    value = value.strip().lower()
    if not value or len(value) > 260 or any(c in value for c in "/@?#\\ \t"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return None
    else:
        name, sep, rest = value.partition(":")
        rest = sep + rest
        if ":" in rest[1:]:
            return None
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= 6):
        return None
    name = name.rstrip(".")
    port = int(rest[1:]) if rest else None
    if not name or (port is not None and not 0 < port < 65536):
        return None
    return name, port


@dataclass(frozen=True, slots=True)
class AllowedHosts:
    """The host names (optionally with a port) a dashboard answers to."""

    entries: tuple[tuple[str, int | None], ...]

    @classmethod
    def of(cls, auth: Auth) -> AllowedHosts:
        """Loopback names plus the named hosts without credentials; with credentials
        only the named hosts (loopback names when none are named)."""
        named = [p for p in map(parse_host, auth.allowed_hosts) if p is not None]
        loopback = [(name, None) for name in LOOPBACK_HOSTS]
        if auth.configured:
            return cls(tuple(named or loopback))
        return cls(tuple(loopback + named))

    def _match(self, name: str, port: int | None) -> bool:
        return any(n == name and (p is None or p == port) for n, p in self.entries)

    def host_ok(self, header: str | None) -> bool:
        """Whether a request's ``Host`` header names this dashboard."""
        parsed = parse_host(header or "")
        return parsed is not None and self._match(*parsed)

    def origin_ok(self, origin: str) -> bool:
        """Whether an ``Origin`` header is a page of this dashboard (``null`` never is)."""
        try:
            parts = urlsplit(origin.strip())
            port = parts.port
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path:
            return False
        name = parts.hostname.lower().rstrip(".")
        if ":" in name:
            name = f"[{name}]"
        return self._match(name, port or (443 if parts.scheme == "https" else 80))

    def describe(self) -> str:
        return ", ".join(n if p is None else f"{n}:{p}" for n, p in self.entries)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind) is loopback only."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: Auth) -> None:
    """Refuse a non-loopback bind without credentials, or without the names it serves.

    Raises:
        ConfigurationError: naming the settings that allow it.
    """
    if is_loopback(host):
        return
    if not auth.configured:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host!r} (not loopback) without credentials: "
            "set TIDINGS_DASHBOARD_TOKEN (or --token), or TIDINGS_DASHBOARD_USER and "
            "TIDINGS_DASHBOARD_PASSWORD for basic auth"
        )
    if not auth.allowed_hosts:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host!r} (not loopback) without the host "
            "names it is reached by: set TIDINGS_DASHBOARD_HOSTS=ops.example.com (comma-"
            "separated) or pass --allowed-host ops.example.com; requests naming any other "
            "host are refused (DNS rebinding)"
        )
