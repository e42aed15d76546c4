"""App settings from keywords or the environment.

Every setting has an ``App(...)`` keyword and a ``TIDINGS_*`` variable of the same name
(upper case). Keywords win over the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tidings.errors import ConfigurationError
from tidings.ops.embedded import embedded_key, ensure_embedded

_TRUE = {"1", "true", "yes", "on"}


@dataclass(slots=True)
class Settings:
    """Resolved configuration of one App."""

    redis_url: str
    key: str
    mail_url: str = "file://./.tidings/outbox"
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
    store_results: bool = False
    """Keep every job's return value for ``app.result`` (a job's ``store_result`` wins)."""
    result_ttl_s: float = 86400.0
    """Seconds a kept return value lasts (a job's ``result_ttl_s`` wins)."""
    result_max_bytes: int = 1024 * 1024
    """The most bytes a kept return value may take, encoded; over it the job fails."""

    @classmethod
    def resolve(
        cls,
        options: Mapping[str, object],
        env: Mapping[str, str] | None = None,
        *,
        home: Path = Path(".tidings"),
        app_package: str | None = None,
    ) -> Settings:
        """Merge keyword ``options`` over ``env`` (``os.environ`` by default)."""
        env = os.environ if env is None else env

        def get(name: str) -> object | None:
            if options.get(name) is not None:
                return options[name]
            value = env.get(f"TIDINGS_{name.upper()}")
            return value if value not in (None, "") else None

        url = get("redis_url") or env.get("REDIS_URL") or None
        embedded = url is None
        if embedded:
            url = ensure_embedded(home)
        key = get("key")
        if key is None:
            if not embedded:
                raise ConfigurationError(
                    "TIDINGS_KEY (or App(key=...)) is required when TIDINGS_REDIS_URL is set"
                )
            key = embedded_key(home)
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
        settings.database_url = f"sqlite:///{home / 'notifications.sqlite3'}"
        names = ("mail_url", "mail_from", "sms_url", "webhook_secret", "prefix", "templates")
        for name in (*names, "schedule_timezone", "database_url", "slack_url", "encryption_key"):
            value = get(name)
            if value is not None:
                setattr(settings, name, str(value))
        for name in ("retry_after",):
            value = get(name)
            if value is not None:
                settings.retry_after = _number(name, value)
        value = get("wait_replicas")
        if value is not None:
            n = _number("wait_replicas", value)
            if n < 0 or n != int(n):
                raise ConfigurationError(
                    f"TIDINGS_WAIT_REPLICAS must be a whole number >= 0, not {value!r}"
                )
            settings.wait_replicas = int(n)
        value = get("wait_replicas_timeout")
        if value is not None:
            settings.wait_replicas_timeout = _number("wait_replicas_timeout", value)
            if settings.wait_replicas_timeout <= 0:
                raise ConfigurationError(
                    f"TIDINGS_WAIT_REPLICAS_TIMEOUT must be positive seconds, not {value!r}"
                )
        value = get("store_results")
        if value is not None:
            settings.store_results = value is True or str(value).lower() in _TRUE
        value = get("result_ttl_s")
        if value is not None:
            settings.result_ttl_s = _number("result_ttl_s", value)
            if settings.result_ttl_s <= 0:
                raise ConfigurationError(
                    f"TIDINGS_RESULT_TTL_S must be positive seconds, not {value!r}"
                )
        value = get("result_max_bytes")
        if value is not None:
            n = _number("result_max_bytes", value)
            if n < 1 or n != int(n):
                raise ConfigurationError(
                    f"TIDINGS_RESULT_MAX_BYTES must be a whole number of bytes >= 1, not {value!r}"
                )
            settings.result_max_bytes = int(n)
        value = get("max_payload_bytes")
        if value is not None:
            settings.max_payload_bytes = int(_number("max_payload_bytes", value))
        value = get("webhook_allow_private")
        if value is not None:
            settings.webhook_allow_private = value is True or str(value).lower() in _TRUE
        value = get("metrics")
        if value is not None:
            settings.metrics = value is True or str(value).lower() in _TRUE
        for name in ("after_commit", "mail_allow_test_domains"):
            value = get(name)
            if value is not None:
                setattr(settings, name, value is True or str(value).lower() in _TRUE)
        value = get("missing_models")
        if value is not None:
            if str(value) not in ("fail", "skip"):
                raise ConfigurationError(
                    f"TIDINGS_MISSING_MODELS must be 'fail' or 'skip', not {value!r}"
                )
            settings.missing_models = str(value)
        value = get("encrypt")
        if value is not None:
            settings.encrypt = value is True or str(value).lower() in _TRUE
        conns = options.get("connections")
        if isinstance(conns, Mapping):
            settings.connections = {str(k): str(v) for k, v in conns.items()}
        if settings.retry_after <= 0:
            raise ConfigurationError("retry_after must be positive")
        return settings


def _number(name: str, value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{name} must be a number, not {value!r}") from exc
