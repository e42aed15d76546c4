"""The whole exception tree of tidings.

Users catch these; nothing from redis-py, aiosmtplib or httpx leaks past a boundary
(it is translated once, ``raise X(...) from exc``)::

    TidingsError
    ├── ConfigurationError        bad settings, DSN or missing key
    ├── SerializationError        a value cannot be queued (names the field path)
    │   ├── PayloadTooLarge       the encoded payload is over the size limit
    │   ├── ResultTooLarge        a job's return value is over ``result_max_bytes``
    │   └── ModelNotFound         a model argument's row is gone when the job runs
    ├── QueueUnavailable          the producer could not reach Redis
    ├── PayloadRejected           the worker refused a payload (bad signature, malformed,
    │                             not allowed, unknown class); never retried
    ├── JobTimeout                a job ran past its ``timeout``
    ├── MaxAttemptsExceeded       a job was reserved more times than it may be tried
    ├── JobStalled                a job's lease expired more often than max_stalls allows
    ├── JobCancelled              the job was cancelled (``app.cancel``); never retried
    ├── JobFailedError            ``app.result`` of a job that failed for good
    ├── ResultMissing             ``app.result`` of a job with no result (expired, never
    │                             stored, or no such job)
    ├── JobNotFound               ``app.cancel`` of an id no queue knows
    ├── BatchClosed               jobs added to a batch that finished or does not exist
    ├── ValidationError           an address, header, number or URL is invalid (permanent)
    ├── TemplateError             a mail template failed to render (permanent)
    └── ChannelError              a channel could not deliver
        ├── TransientChannelError retry later (4xx SMTP, 429/5xx HTTP, timeouts)
        └── PermanentChannelError do not retry (5xx SMTP, 4xx HTTP, 410)

``permanent`` tells the worker to fail the job at once instead of retrying it;
``retry_after_s`` (when set) is the least delay before the next attempt.
"""

from __future__ import annotations

from typing import ClassVar


class TidingsError(Exception):
    """Base of every error tidings raises."""

    permanent: ClassVar[bool] = False
    retry_after_s: float | None = None


class ConfigurationError(TidingsError):
    """Settings are missing or invalid."""

    permanent = True


class SerializationError(TidingsError):
    """A value cannot be encoded into (or decoded from) a payload.

    Attributes:
        path: dotted path of the offending field, e.g. ``user.created_at``.
    """

    permanent = True

    def __init__(self, message: str, *, path: str = "") -> None:
        self.path = path
        super().__init__(f"{message} (at {path})" if path else message)


class ModelNotFound(SerializationError):
    """A model argument (stored by class and primary key) has no row any more.

    The worker fails the job with this reason, or drops it when ``missing_models`` is
    ``"skip"`` (``TIDINGS_MISSING_MODELS``) or the job, listener or notification sets
    ``delete_when_missing_models = True``.

    Attributes:
        model: ``module:QualName`` of the model class.
        pk: the primary key that was looked up.
    """

    def __init__(self, model: str, pk: object) -> None:
        self.model = model
        self.pk = pk
        super().__init__(
            f"{model} with primary key {pk!r} no longer exists (deleted after dispatch, or "
            "dispatched inside a transaction that rolled back: see after_commit); set "
            "TIDINGS_MISSING_MODELS=skip or delete_when_missing_models = True to drop such jobs"
        )


class PayloadTooLarge(SerializationError):
    """The encoded payload exceeds the configured size limit."""


class QueueUnavailable(TidingsError):
    """Redis could not be reached to push a job; nothing was written."""


class PayloadRejected(TidingsError):
    """A worker refused a payload: unsigned, tampered, malformed or not allowed."""

    permanent = True


class JobTimeout(TidingsError):
    """A job ran longer than its timeout."""


class MaxAttemptsExceeded(TidingsError):
    """A job was reserved more times than its ``tries`` allow."""

    permanent = True


class JobStalled(TidingsError):
    """A job's lease expired more often than its ``max_stalls`` allows (its worker died
    or froze past ``retry_after`` each time); it goes to the failed store unrun."""

    permanent = True


class ResultTooLarge(SerializationError):
    """A job's encoded return value is over ``result_max_bytes``; the job fails."""


class JobCancelled(TidingsError):
    """The job was cancelled (``app.cancel``): raised inside a sync job by
    ``self.check_cancelled()``, and by ``app.result`` of a cancelled job. A cancelled job
    is not retried and its ``failed()`` is not called.

    Attributes:
        job_id: the job.
    """

    permanent = True

    def __init__(self, message: str = "job cancelled", *, job_id: str = "") -> None:
        self.job_id = job_id
        super().__init__(message)


class JobFailedError(TidingsError):
    """``app.result`` of a job that failed for good.

    Attributes:
        job_id: the job.
        exception_class: the class path of the exception it failed with
            (``module.QualName``).
        exception_message: its message, redacted (never the traceback).
    """

    def __init__(self, job_id: str, exception_class: str, exception_message: str) -> None:
        self.job_id = job_id
        self.exception_class = exception_class
        self.exception_message = exception_message
        super().__init__(f"job {job_id} failed: {exception_class}: {exception_message}")


class ResultMissing(TidingsError):
    """``app.result`` of a job whose result expired (``result_ttl_s``), was never stored
    (the job does not set ``store_result``), or that no queue knows.

    Attributes:
        job_id: the job.
    """

    def __init__(self, message: str, *, job_id: str = "") -> None:
        self.job_id = job_id
        super().__init__(message)


class JobNotFound(TidingsError):
    """``app.cancel`` of an id no queue holds a record of.

    Attributes:
        job_id: the id asked for.
    """

    def __init__(self, message: str, *, job_id: str = "") -> None:
        self.job_id = job_id
        super().__init__(message)


class BatchClosed(TidingsError):
    """Jobs were added to a batch that has finished (or was pruned); none was pushed.

    Attributes:
        batch_id: the batch.
    """

    permanent = True

    def __init__(self, message: str, *, batch_id: str = "") -> None:
        self.batch_id = batch_id
        super().__init__(message)


class ValidationError(TidingsError):
    """An address, header, phone number or URL is invalid.

    Attributes:
        field: which input was refused (``to``, ``subject``, ``url`` ...).
    """

    permanent = True

    def __init__(self, message: str, *, field: str = "") -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class TemplateError(TidingsError):
    """A template could not be found or rendered; retrying cannot help."""

    permanent = True


class ChannelError(TidingsError):
    """A notification channel could not deliver.

    Attributes:
        channel: the channel name (``mail``, ``sms``, ``webhook`` ...).
        code: the provider's status (SMTP reply code, HTTP status) when there is one.
        retry_after_s: least delay before the next attempt, when the peer asked for one.
    """

    def __init__(
        self,
        message: str,
        *,
        channel: str = "",
        code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.channel = channel
        self.code = code
        self.retry_after_s = retry_after_s
        super().__init__(message)


class TransientChannelError(ChannelError):
    """Delivery failed in a way a later attempt may fix."""


class PermanentChannelError(ChannelError):
    """Delivery failed in a way no retry can fix."""

    permanent = True


class BlockingDispatchWarning(RuntimeWarning):
    """A sync push to Redis was made on a running event loop's thread (it blocks the
    loop). Filter it with ``warnings.simplefilter("ignore", BlockingDispatchWarning)``
    where that is intended; in ``async def`` code use the ``*_async`` calls instead."""
