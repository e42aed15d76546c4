"""What a worker is told (``notify-worker`` options), its exit codes, and the text it
writes about an exception (redacted, bounded)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

from tidings.observability.redaction import redact

EXIT_MEMORY = 12
EXIT_STUCK = 13
EXIT_SOFTWARE = 70  # sysexits EX_SOFTWARE: a part of the worker kept dying
EXIT_CONFIG = 78  # sysexits EX_CONFIG: e.g. a Redis too old to run on

MAX_EXCEPTION_TEXT = 8192


@dataclass(slots=True)
class WorkerOptions:
    """``notify-worker`` options."""

    queues: list[str] = field(default_factory=lambda: ["default"])
    connection: str | None = None
    concurrency: int = 16
    once: bool = False
    stop_when_empty: bool = False
    max_jobs: int = 0
    max_time_s: float = 0.0
    memory_mb: float = 0.0
    sleep_s: float = 3.0
    timeout_s: float = 60.0
    tries: int = 1
    max_stalls: int = 3
    """How often a job's lease may expire (its worker died or froze) before the job goes
    to the failed store unrun, as "stalled N times" (a job's ``max_stalls`` wins)."""
    backoff_s: float = 0.0
    rest_s: float = 0.0
    grace_s: float = 30.0
    give_up_s: float = 60.0
    """How long a job's Redis move (release, fail, a chain's next link) is retried through
    an outage before the worker gives up on it and leaves the job to its lease."""
    fault_point: str | None = None
    result_max_bytes: int = 1024 * 1024
    """The most bytes a job's kept return value may take when its envelope names none."""


def short_error(exc: BaseException) -> str:
    """``Type: message``, redacted, then cut to 500 characters, for logs and events."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a hostile __str__ must not break the worker's bookkeeping
        text = f"{type(exc).__name__}: <str() failed>"
    # Redact before cutting: a secret straddling the cut must not survive in part.
    text = redact(text)
    return text if len(text) <= 500 else text[:500] + "..."


def exception_class(exc: BaseException) -> str:
    """The class path of ``exc``: ``module.QualName`` (``QualName`` for builtins)."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def exception_message(exc: BaseException) -> str:
    """The message of ``exc``, redacted, cut to 500 characters (no traceback)."""
    try:
        text = str(exc)
    except Exception:
        text = "<str() failed>"
    text = redact(text)
    return text if len(text) <= 500 else text[:500] + "..."


def exception_text(exc: BaseException) -> str:
    """The traceback the failed store keeps: redacted whole, then cut in the middle."""
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:  # a hostile __str__ must not break the worker's bookkeeping
        text = f"{type(exc).__name__}: <traceback could not be formatted>"
    text = redact(text)
    if len(text) > MAX_EXCEPTION_TEXT:
        text = (
            text[: MAX_EXCEPTION_TEXT // 2]
            + "\n...[truncated]...\n"
            + text[-MAX_EXCEPTION_TEXT // 2 :]
        )
    return text
