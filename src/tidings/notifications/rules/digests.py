"""Digests: what one notifiable receives within a window goes out as ONE message.

::

    class NewComment(Notification, ShouldQueue):
        digest = timedelta(minutes=10)          # or {"mail": timedelta(minutes=10)}
        def to_mail_digest(self, notifiable, items): ...   # items: oldest first

How it holds under faults (every step is one Lua script, safe to run twice):

1. ``notify()`` appends the item (the signed, serialized notification) to the list of
   (notifiable, type, channel) with ``digest_add.lua``. The same script opens the
   window when none is open: it stores the window id and pushes a delayed flush job
   (:class:`SendDigest`) due when the window ends. The window opens at the first item.
   A re-sent command (its reply lost) carries the same item id and is not appended twice.
2. When the window ends, the flush job claims it with ``digest_claim.lua``: the list is
   RENAMEd to ``…:claimed:<window id>`` and the window closes (the next item opens a new
   window with a new flush job), all in one step. An item is therefore in exactly one
   window, and a window in exactly one claimed list.
   A flush of an interruptive channel (SMS) inside the notifiable's quiet hours does
   not claim: it puts itself back until they end, and the window keeps collecting.
3. The job sends one message built from the whole claimed list, then deletes it. A
   worker killed in between leaves the claimed list; the job's lease runs out, another
   worker runs it again, the claim hands back the same claimed list, and the whole digest is
   sent again (never a part of it). The message carries the window id as its delivery
   id (the Message-ID of a mail), so a receiver can recognise the repeat.

The guarantee: every item is delivered in exactly one digest; a digest is delivered at
least once, and when more than once, as identical whole copies with the same delivery id.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from tidings import _clock, _current
from tidings.errors import ConfigurationError, PayloadRejected
from tidings.jobs.backoff import Exponential
from tidings.jobs.compose import build_body
from tidings.jobs.job import Job, option
from tidings.moves.queues import unavailable_guard
from tidings.notifications.messages import MailMessage, SmsMessage
from tidings.notifications.rules.preferences import type_name
from tidings.notifications.rules.quiet_hours import interruptive_channels, quiet_until
from tidings.redis import scripts
from tidings.redis.keys import digest_base
from tidings.wire import serializer
from tidings.wire.encryption import is_encrypted, open_data, seal_data
from tidings.wire.envelope import seal

log = logging.getLogger("tidings.notifications")

__all__ = [
    "DEFAULT_LAYOUTS",
    "DigestNotification",
    "SendDigest",
    "digest_window_s",
    "recipient_key",
]

#: How long item ids are remembered against a re-sent append (ms), and how long the
#: window marker outlives its window.
SEEN_KEEP_MS = 24 * 3600 * 1000
#: How long a claimed digest that could not be delivered (its job failed) is kept, so
#: ``notify-worker failed retry`` can still send it.
CLAIMED_KEEP_MS = 7 * 24 * 3600 * 1000
#: Channels with a default digest layout (others need ``to_<channel>_digest``).
DEFAULT_LAYOUTS = frozenset({"mail", "sms", "database"})


def _seconds(value: Any, where: str) -> float | None:
    if value is None or value is False:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(
            f"{where} must be a timedelta or seconds, not {type(value).__name__}"
        )
    if seconds <= 0:
        raise ConfigurationError(f"{where} must be positive, not {seconds:g} s")
    return seconds


def digest_window_s(notification: Any, channel: str) -> float | None:
    """The digest window of ``notification`` on ``channel`` (seconds), or None.

    ``digest`` is a timedelta (every channel), a ``{channel: timedelta}`` dict, or a
    method ``digest(channel)`` returning either.

    Raises:
        ConfigurationError: not a positive duration, or a digested channel with neither a
            default layout nor ``to_<channel>_digest``.
    """
    value = getattr(notification, "digest", None)
    if value is None:
        return None
    where = f"{type(notification).__qualname__}.digest"
    if callable(value):
        value = value(channel)
    if isinstance(value, dict):
        value = value.get(channel)
    seconds = _seconds(value, where)
    custom = getattr(notification, f"to_{channel}_digest", None)
    if seconds is not None and channel not in DEFAULT_LAYOUTS and not callable(custom):
        raise ConfigurationError(
            f"{type(notification).__qualname__} digests {channel!r} but has no "
            f"to_{channel}_digest(notifiable, items) (default layouts: mail, sms, database)"
        )
    return seconds


def recipient_key(notifiable: Any, channel: str, notification: Any) -> str:
    """Who a digest is for: the database channel's (type, id), else the channel's route
    (an on-demand notifiable)."""
    from tidings.notifications.channels.database import notifiable_key

    try:
        kind, ident = notifiable_key(notifiable, notification)
    except Exception:
        route = notifiable.route_notification_for(channel, notification)
        kind, ident = "route", str(getattr(route, "url", route))
    return f"{kind}\x00{ident}"


def digest_name(notifiable: Any, notification: Any, channel: str) -> str:
    """The digest's key name: a hash of (recipient, type, channel)."""
    who = recipient_key(notifiable, channel, notification)
    raw = f"{who}\x00{type_name(notification)}\x00{channel}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _context(name: str) -> bytes:
    return f"digest:{name}".encode()


def _aad_path(name: str) -> str:
    return f"digest:{name}"


def encode_item(app: Any, name: str, item_id: str, notification: Any) -> bytes:
    """The stored record of one item: signed (the app's key, bound to the digest), and
    encrypted like a job's payload when the notification is ``ShouldBeEncrypted`` (or
    ``TIDINGS_ENCRYPT`` is on)."""
    data = serializer.encode(notification, path="notification")
    data = seal_data(data, notification, item_id, _aad_path(name))
    raw = orjson.dumps({"i": item_id, "t": _clock.now(), "n": data})
    signature: str = app.signer.sign(raw, _context(name))
    return signature.encode() + b"|" + raw


def decode_item(app: Any, name: str, record: bytes) -> tuple[str, Any]:
    """``(item id, notification)`` of a stored record.

    Raises:
        PayloadRejected: the signature does not match (a record not written by this app).
    """
    signature, _, raw = record.partition(b"|")
    if not app.signer.verify(raw, signature, _context(name)):
        raise PayloadRejected("bad signature on a digest item")
    doc = orjson.loads(raw)
    data = doc["n"]
    if is_encrypted(data):
        data = open_data({"data": data, "uuid": doc["i"], "job": _aad_path(name)}, app)
    return str(doc["i"]), serializer.decode(data, app.resolve_class)


@dataclass(slots=True)
class Added:
    """What :func:`add` did."""

    item_id: str
    window_id: str
    added: bool
    opened: bool


def _queue_of(notification: Any, channel: str) -> str:
    queues = notification.via_queues() or {}
    return str(queues.get(channel) or option(notification, "queue") or "default")


def _prepare(
    app: Any, notifiable: Any, notification: Any, channel: str, window_s: float, item_id: str
) -> tuple[Any, list[str], list[Any], SendDigest]:
    name = digest_name(notifiable, notification, channel)
    queue = _queue_of(notification, channel)
    connection = option(notification, "connection")
    rq = app.queue_for(connection)
    base = digest_base(rq.prefix, queue, name)
    window_id = uuid.uuid4().hex
    loud = channel in interruptive_channels(notification, notifiable)
    job = SendDigest(
        notifiable, channel, name, queue, connection, window_id,
        type(notification).__qualname__, loud,
    )  # fmt: skip
    envelope = seal(build_body(job, window_id), app.signer, max_bytes=app.max_payload_bytes,
                    queue=queue)  # fmt: skip
    app.note_queue(queue)
    k = rq.keys(queue)
    keys = [base, f"{base}:seen", f"{base}:window", k.delayed, k.notify, k.jobs]
    record = encode_item(app, name, item_id, notification)
    args = [item_id, record, int(window_s * 1000), window_id, envelope, SEEN_KEEP_MS]
    return rq, keys, args, job


def add(
    app: Any, notifiable: Any, notification: Any, channel: str, window_s: float, item_id: str
) -> Added:
    """Append one item to its digest window (opening it when none is open).

    Raises:
        QueueUnavailable: Redis could not be reached or is out of memory.
    """
    rq, keys, args, job = _prepare(app, notifiable, notification, channel, window_s, item_id)
    # A push like any other: the fast lane, WAIT for replicas when configured, and
    # QueueUnavailable when Redis cannot take it (nothing was appended then).
    with unavailable_guard(f"digest on {job.digest_queue!r}"):
        added, window, opened = rq.produce(job.digest_queue, scripts.DIGEST_ADD, keys, args)
    return Added(item_id, _text(window), bool(added), bool(opened))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- the message built from the items ---------------------------------------------------------


def _mail_summary(item: Any, notifiable: Any) -> str:
    to_mail = getattr(item, "to_mail", None)
    if callable(to_mail):
        message = to_mail(notifiable)
        text = getattr(message, "subject_text", None) or next(
            iter(getattr(message, "intro_lines", []) or []), None
        )
        if text:
            return str(text)
    return type(item).__qualname__


def default_mail(notifiable: Any, items: list[Any]) -> MailMessage:
    """The default digest mail: "N new notifications" and one line per item (its
    subject), oldest first."""
    message = MailMessage().subject(f"{len(items)} new notifications")
    for item in items:
        message.line(_mail_summary(item, notifiable))
    return message


def default_sms(notifiable: Any, items: list[Any]) -> SmsMessage:
    """The default digest SMS: the count and each item's text, cut at 1,600 characters."""
    texts = []
    for item in items:
        sms = getattr(item, "to_sms", None)
        texts.append(str(getattr(sms(notifiable), "content", "")) if callable(sms) else "")
    body = f"{len(items)} new: " + " | ".join(t for t in texts if t)
    return SmsMessage(body[:1600])


def default_database(notifiable: Any, items: list[Any]) -> dict[str, Any]:
    """The default digest row: ``{"digest": True, "count": N, "items": [...]}``."""
    rows = []
    for item in items:
        method = getattr(item, "to_database", None) or getattr(item, "to_dict", None)
        rows.append(method(notifiable) if callable(method) else {})
    return {"digest": True, "count": len(items), "items": rows}


_DEFAULTS = {"mail": default_mail, "sms": default_sms, "database": default_database}


class DigestNotification:
    """The notification a flush sends: ``to_<channel>(notifiable)`` returns the first
    item's ``to_<channel>_digest(notifiable, items)``, else the default layout."""

    def __init__(self, items: list[Any], channel: str, window_id: str) -> None:
        self.items = items
        self.channel = channel
        self.window_id = window_id

    def __getattr__(self, name: str) -> Any:
        if name.startswith("to_") and not name.endswith("_digest"):
            channel = name[3:]
            custom = getattr(self.items[0], f"{name}_digest", None)
            if callable(custom):
                return lambda notifiable: custom(notifiable, self.items)
            default = _DEFAULTS.get(channel)
            if default is not None:
                return lambda notifiable: default(notifiable, self.items)
        raise AttributeError(name)

    def database_type(self, notifiable: Any) -> str:
        """The first item's type name (the digest row's ``type``)."""
        custom = getattr(self.items[0], "database_type", None)
        if callable(custom):
            kind = custom(notifiable)
            if isinstance(kind, str) and kind:
                return kind
        cls = type(self.items[0])
        return f"{cls.__module__}.{cls.__qualname__}"

    def should_send(self, notifiable: Any, channel: str) -> bool:
        """Digests are decided at notify time: always."""
        return True

    def via(self, notifiable: Any) -> list[str]:
        return [self.channel]


@dataclass
class SendDigest(Job):
    """Flush one digest window: claim it, send one message from all its items, delete it.

    Its job id is the window id (the delivery id of the message).
    """

    notifiable: Any
    channel: str
    name: str
    digest_queue: str
    digest_connection: str | None
    window_id: str
    notification_name: str
    interruptive: bool = False
    """Quiet hours hold this channel: a flush inside them waits for their end, the
    window still open (items keep joining it)."""

    def option_defaults(self) -> dict[str, Any]:
        """The App's retry defaults for notifications (as SendQueuedNotification)."""
        try:
            s = _current.current().settings
        except Exception:
            return {}
        backoff = Exponential(
            base_s=s.notification_backoff, factor=2.0, max_s=s.notification_backoff_max
        )
        return {"tries": s.notification_tries, "backoff": backoff}

    def display_name(self) -> str:
        """``NewComment digest (mail)``."""
        return f"{self.notification_name} digest ({self.channel})"

    async def handle(self) -> Any:
        """Claim, deliver, delete (see the module docstring)."""
        from tidings.notifications.queued import is_transient

        app = _current.current()
        if self.interruptive:
            now = datetime.now(UTC)
            until = quiet_until(self.notifiable, now)
            if until is not None:  # not claimed: the window stays open until then
                self.release(max(1.0, (until - now).total_seconds()))
                log.info("%s held by quiet hours until %s", self.display_name(), until)
                return None
        rq = app.queue_for(self.digest_connection)
        client = rq.aclient()
        base = digest_base(rq.prefix, self.digest_queue, self.name)
        claimed = f"{base}:claimed:{self.window_id}"
        keys = [base, f"{base}:window", claimed]
        records = await scripts.DIGEST_CLAIM.acall(client, keys, [self.window_id, CLAIMED_KEEP_MS])
        if not records:
            return None  # delivered by an earlier run
        items: list[Any] = []
        for record in records:
            try:
                items.append(decode_item(app, self.name, bytes(record))[1])
            except PayloadRejected:
                log.error("dropped a digest item with a bad signature (%s)", self.display_name())
        if items:
            digest = DigestNotification(items, self.channel, self.window_id)
            try:
                response = await app.notifications.deliver(
                    self.notifiable, digest, self.channel, self.window_id
                )
            except Exception as exc:
                if self.job_id is not None and not is_transient(exc):
                    self.fail(exc)  # kept claimed (CLAIMED_KEEP_MS) for a `failed retry`
                    return None
                raise
        else:
            response = None
        await client.delete(claimed)
        return response
