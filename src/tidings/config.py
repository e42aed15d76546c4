"""App settings from keywords or the environment.

Every setting has an ``App(...)`` keyword and a ``TIDINGS_*`` variable of the same name
(upper case). Keywords win over the environment. ``Settings.sources`` records where
each value was read from, so an error can name the place that fixes it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from tidings.errors import ConfigurationError
from tidings.ops.embedded import embedded_key, ensure_embedded, home_dir

_TRUE = {"1", "true", "yes", "on"}


@dataclass(slots=True)
class Settings:
    """Resolved configuration of one App."""

    redis_url: str
    key: str
    mail_url: str = "file://./.tidings/outbox"
    """Unset: ``file://HOME/outbox`` (the embedded directory's outbox)."""
    mail_from: str = "tidings@localhost"
    sms_url: str = "log://"
    webhook_secret: str | None = None
    allowed_modules: tuple[str, ...] = ("tidings",)
    retry_after: float = 90.0
    prefix: str = "tidings"
    webhook_allow_private: bool = False
    templates: str | None = None
    max_payload_bytes: int = 1024 * 1024
    connections: dict[str, str] = field(default_factory=dict)
    embedded: bool = False
    schedule_timezone: str | None = None
    """The zone cron schedules use when they give no ``tz=`` (None: UTC)."""
    metrics: bool = True
    after_commit: bool = False
    missing_models: str = "fail"
    mail_allow_test_domains: bool = False
    database_url: str = "sqlite:///.tidings/notifications.sqlite3"
    slack_url: str | None = None
    encrypt: bool = False
    encryption_key: str | None = None
    wait_replicas: int = 0
    """Replicas that must confirm every push (Redis ``WAIT``) before ``dispatch()``
    returns; 0: none (asynchronous replication, the Redis default)."""
    wait_replicas_timeout: float = 0.1
    """Seconds a push waits for those confirmations before raising QueueUnavailable."""
    notification_tries: int = 5
    """Tries of a queued notification that sets no ``tries``, for transient channel
    errors (an SMTP 4xx, a dropped connection, an HTTP 429/5xx); other errors fail at once."""
    notification_backoff: float = 1.0
    """Delay before the first retry of such a notification (s); it doubles per attempt,
    with jitter, up to ``notification_backoff_max``."""
    notification_backoff_max: float = 60.0
    """Longest delay between two tries of such a notification (s)."""
    home: str = ""
    """The embedded directory: the embedded Redis, its key, the mail outbox."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each setting that was given came from (``where()`` words it)."""

    store_results: bool = False
    """Keep every job's return value for ``app.result`` (a job's ``store_result`` wins)."""
    result_ttl_s: float = 86400.0
    """Seconds a kept return value lasts (a job's ``result_ttl_s`` wins)."""
    result_max_bytes: int = 1024 * 1024
    """The most bytes a kept return value may take, encoded; over it the job fails."""
    envelope_frame: int = 2
    """The frame new envelopes are written in: 2, the compact one; 1, the frame of
    tidings before it, which every worker reads (for a rolling upgrade: producers
    upgraded before the workers keep writing 1 until every worker reads 2)."""

    def where(self, name: str) -> str:
        """Where setting ``name`` was read from, in words (``settings.TIDINGS['key']``,
        ``the environment variable TIDINGS_KEY``, ``the default``)."""
        return self.sources.get(name, "the default")

    @classmethod
    def resolve(
        cls,
        options: Mapping[str, object],
        env: Mapping[str, str] | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
        anchor: str | os.PathLike[str] | None = None,
        app_package: str | None = None,
        given_in: str = "App(...)",
        labels: Mapping[str, str] | None = None,
    ) -> Settings:
        """Merge keyword ``options`` over ``env`` (``os.environ`` by default).

        Args:
            home: the embedded directory, when given explicitly.
            anchor: the directory the embedded ``.tidings`` goes in otherwise (Django's
                ``BASE_DIR``, the directory of the App's module); see
                :func:`tidings.ops.embedded.home_dir`.
            given_in: how error messages name ``options`` (``settings.TIDINGS``).
            labels: a name for where single options came from, over ``given_in``
                (``Django's EMAIL_* settings``).
        """
        env = os.environ if env is None else env
        sources: dict[str, str] = {}

        def label(name: str) -> str:
            if labels and name in labels:
                return labels[name]
            if given_in.endswith("(...)"):
                return f"{given_in[:-4]}{name}=...)"
            return f"{given_in}[{name!r}]"

        def get(name: str) -> object | None:
            if options.get(name) is not None:
                sources[name] = label(name)
                return options[name]
            value = env.get(f"TIDINGS_{name.upper()}")
            if value not in (None, ""):
                sources[name] = f"the environment variable TIDINGS_{name.upper()}"
                return value
            return None

        url = get("redis_url")
        if url is None and env.get("REDIS_URL"):
            url = env["REDIS_URL"]
            sources["redis_url"] = "the environment variable REDIS_URL"
        embedded = url is None
        explicit_home = options.get("home") if home is None else home
        home_path, home_from = home_dir(explicit_home, env, anchor=anchor)  # type: ignore[arg-type]
        sources["home"] = home_from
        if embedded:
            url = ensure_embedded(home_path)
        key = get("key")
        if key is None:
            if not embedded:
                raise ConfigurationError(
                    f"no signing key: one is required with a Redis URL (redis_url came from "
                    f"{sources['redis_url']}); set {label('key')} or the environment "
                    "variable TIDINGS_KEY (the same key on every producer and worker)"
                )
            key = embedded_key(home_path)
        allowed = get("allowed_modules")
        if isinstance(allowed, str):
            modules = tuple(m.strip() for m in allowed.split(",") if m.strip())
        elif allowed is not None:
            modules = tuple(str(m) for m in allowed)  # type: ignore[attr-defined]
        else:
            modules = tuple(m for m in (app_package,) if m)
        if "tidings" not in modules:
            modules = (*modules, "tidings")
        settings = cls(redis_url=str(url), key=str(key), allowed_modules=modules, embedded=embedded)
        settings.home = str(home_path)
        settings.sources = sources
        settings.database_url = f"sqlite:///{home_path / 'notifications.sqlite3'}"
        settings.mail_url = f"file://{home_path / 'outbox'}"
        names = ("mail_url", "mail_from", "sms_url", "webhook_secret", "prefix", "templates")
        for name in (*names, "schedule_timezone", "database_url", "slack_url", "encryption_key"):
            value = get(name)
            if value is not None:
                setattr(settings, name, str(value))
        for name in ("retry_after", "notification_backoff", "notification_backoff_max"):
            value = get(name)
            if value is not None:
                setattr(settings, name, _number(name, value, sources))
        for name in ("wait_replicas", "notification_tries"):
            value = get(name)
            if value is not None:
                n = _number(name, value, sources)
                if n < 0 or n != int(n):
                    raise ConfigurationError(
                        f"TIDINGS_{name.upper()} must be a whole number >= 0, not {value!r} "
                        f"(read from {sources[name]})"
                    )
                setattr(settings, name, int(n))
        value = get("wait_replicas_timeout")
        if value is not None:
            settings.wait_replicas_timeout = _number("wait_replicas_timeout", value, sources)
            if settings.wait_replicas_timeout <= 0:
                raise ConfigurationError(
                    f"TIDINGS_WAIT_REPLICAS_TIMEOUT must be positive seconds, not {value!r} "
                    f"(read from {sources['wait_replicas_timeout']})"
                )
        value = get("store_results")
        if value is not None:
            settings.store_results = value is True or str(value).lower() in _TRUE
        value = get("result_ttl_s")
        if value is not None:
            settings.result_ttl_s = _number("result_ttl_s", value, sources)
            if settings.result_ttl_s <= 0:
                raise ConfigurationError(
                    f"TIDINGS_RESULT_TTL_S must be positive seconds, not {value!r} "
                    f"(read from {sources['result_ttl_s']})"
                )
        value = get("result_max_bytes")
        if value is not None:
            n = _number("result_max_bytes", value, sources)
            if n < 1 or n != int(n):
                raise ConfigurationError(
                    f"TIDINGS_RESULT_MAX_BYTES must be a whole number of bytes >= 1, not {value!r}"
                )
            settings.result_max_bytes = int(n)
        value = get("max_payload_bytes")
        if value is not None:
            settings.max_payload_bytes = int(_number("max_payload_bytes", value, sources))
        for name in ("webhook_allow_private", "metrics", "after_commit", "mail_allow_test_domains"):
            value = get(name)
            if value is not None:
                setattr(settings, name, value is True or str(value).lower() in _TRUE)
        value = get("envelope_frame")
        if value is not None:
            _choice("envelope_frame", value, ("1", "2"), "1 or 2", sources)
            settings.envelope_frame = int(str(value))
        value = get("missing_models")
        if value is not None:
            _choice("missing_models", value, ("fail", "skip"), "'fail' or 'skip'", sources)
            settings.missing_models = str(value)
        value = get("encrypt")
        if value is not None:
            settings.encrypt = value is True or str(value).lower() in _TRUE
        conns = options.get("connections")
        if isinstance(conns, Mapping):
            settings.connections = {str(k): str(v) for k, v in conns.items()}
        if settings.retry_after <= 0:
            raise ConfigurationError(
                f"retry_after must be positive (read from {settings.where('retry_after')})"
            )
        return settings


def _choice(
    name: str, value: object, allowed: tuple[str, ...], words: str, sources: Mapping[str, str]
) -> None:
    """Refuse ``value`` for setting ``name`` unless it is one of ``allowed``."""
    if str(value) not in allowed:
        raise ConfigurationError(
            f"TIDINGS_{name.upper()} must be {words}, not {value!r} (read from {sources[name]})"
        )


def _number(name: str, value: object, sources: Mapping[str, str]) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        where = sources.get(name, "the default")
        raise ConfigurationError(
            f"{name} must be a number, not {value!r} (read from {where})"
        ) from exc
