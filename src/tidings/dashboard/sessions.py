"""Login sessions, CSRF tokens and the failed-login throttle of the dashboard.

* **Sessions.** Signing in on ``/login`` creates a random session id (256 bits) that
  only the browser's ``tidings_auth`` cookie holds. Redis keeps its SHA-256 under
  ``{prefix}:dashboard:session:<hex>`` with an expiry (:data:`SESSION_TTL_S`), so every
  dashboard process of a deployment knows it, ``/logout`` ends it, and whoever reads
  Redis learns no cookie. The stored value is a fingerprint of the credential: a new
  token ends every session of the old one.
* **CSRF.** The ``tidings_csrf`` cookie holds a random nonce; a form's token is an HMAC,
  under a server secret derived from the App's signing key, of that nonce and the
  session id. A client that picks its own cookie cannot pick a matching token.
* **Throttle.** :class:`LoginThrottle` counts wrong credentials (login form, Bearer,
  Basic) per client address; past :data:`MAX_FAILURES` in :data:`FAILURE_WINDOW_S` the
  address gets 429 for the rest of the window, even with the right token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from collections import deque
from typing import Any

CSRF_COOKIE = "tidings_csrf"
AUTH_COOKIE = "tidings_auth"
SESSION_TTL_S = 12 * 3600
MAX_FAILURES = 10
FAILURE_WINDOW_S = 60.0
#: Client addresses remembered by the throttle (the oldest are dropped past this).
MAX_TRACKED = 10_000


def server_secret(signing_key: bytes) -> bytes:
    """The dashboard's own secret, derived from the App's first signing key (so every
    process of a deployment agrees, and it is no key a job is signed with)."""
    return hmac.new(signing_key, b"tidings-dashboard-secret-v1", hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


class Csrf:
    """Nonces for the CSRF cookie and the form tokens signed for them."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @staticmethod
    def new_nonce() -> str:
        return secrets.token_urlsafe(32)

    def token(self, nonce: str, session: str = "") -> str:
        """The form token for ``nonce`` (the cookie) within ``session`` (may be empty)."""
        msg = b"csrf\0" + nonce.encode() + b"\0" + session.encode()
        return _b64(hmac.new(self._secret, msg, hashlib.sha256).digest())

    def check(self, nonce: str | None, session: str, submitted: str | None) -> bool:
        """Whether a submitted form token was signed here for this cookie and session."""
        if not nonce or not submitted or len(nonce) > 100 or len(submitted) > 100:
            return False
        return hmac.compare_digest(self.token(nonce, session).encode(), submitted.encode())


class Sessions:
    """Login sessions kept in Redis (sync: called from the thread pool)."""

    def __init__(self, client: Any, prefix: str, secret: bytes, credential: str) -> None:
        self._client = client
        self._prefix = prefix
        self._mark = hmac.new(secret, b"credential\0" + credential.encode(),
                              hashlib.sha256).hexdigest()[:32]  # fmt: skip

    def _key(self, session: str) -> str:
        digest = hashlib.sha256(session.encode()).hexdigest()
        return f"{self._prefix}:dashboard:session:{digest}"

    def create(self) -> str:
        """A new session id (for the cookie only), stored for :data:`SESSION_TTL_S`."""
        session = secrets.token_urlsafe(32)
        self._client.set(self._key(session), self._mark, ex=SESSION_TTL_S)
        return session

    def valid(self, session: str | None) -> bool:
        """Whether ``session`` is a live session of the current credential."""
        if not session or len(session) > 100:
            return False
        stored = self._client.get(self._key(session))
        if stored is None:
            return False
        text = stored.decode() if isinstance(stored, bytes) else str(stored)
        return hmac.compare_digest(text.encode(), self._mark.encode())

    def end(self, session: str | None) -> None:
        if session and len(session) <= 100:
            self._client.delete(self._key(session))


class LoginThrottle:
    """Wrong credentials per client address in a sliding window (this process only)."""

    def __init__(self, max_failures: int = MAX_FAILURES,
                 window_s: float = FAILURE_WINDOW_S) -> None:  # fmt: skip
        self.max_failures = max_failures
        self.window_s = window_s
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.get(client)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[client]
        return times

    def blocked_for(self, client: str) -> float:
        """Seconds until ``client`` may try again (0: it may now)."""
        now = time.monotonic()
        with self._lock:
            times = self._recent(client, now)
            if len(times) < self.max_failures:
                return 0.0
            return max(1.0, times[0] + self.window_s - now)

    def failed(self, client: str) -> None:
        """Count one wrong credential from ``client``."""
        now = time.monotonic()
        with self._lock:
            times = self._failures.setdefault(client, deque(maxlen=self.max_failures * 2))
            times.append(now)
            if len(self._failures) > MAX_TRACKED:
                oldest = min(self._failures, key=lambda c: self._failures[c][-1])
                del self._failures[oldest]
