"""BroadcastMessage (what ``to_broadcast`` returns) and the rules of channel names."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from tidings.errors import ValidationError

#: What a channel name may hold: letters, digits and ``_ - . = @ ,`` (``private-`` marks
#: a private channel), at most 200 characters.
CHANNEL_RE = re.compile(r"^[A-Za-z0-9_.=@,\-]{1,200}\Z")
PRIVATE_PREFIX = "private-"
#: What an SSE event name may hold (it is written on an ``event:`` line).
EVENT_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}\Z")


def check_channel(name: object, where: str = "broadcast channel") -> str:
    """``name`` when it is a valid channel name.

    Raises:
        ValidationError: naming ``where`` the name came from.
    """
    if not isinstance(name, str) or not CHANNEL_RE.match(name):
        raise ValidationError(
            f"{where}: {name!r} is not a channel name (letters, digits and _ - . = @ , "
            "only, 1 to 200 characters; 'private-' marks a private channel)",
            field="channel",
        )
    return name


def is_private(name: str) -> bool:
    """Whether ``name`` needs the app's authorisation callback."""
    return name.startswith(PRIVATE_PREFIX)


def encode_data(data: Any, where: str) -> bytes:
    """The JSON text a browser receives as ``data``.

    Raises:
        ValidationError: ``data`` is not JSON (naming ``where`` it came from).
    """
    try:
        return orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        raise ValidationError(f"{where} returned data that is not JSON: {exc}") from None


@dataclass
class BroadcastMessage:
    """What a notification's ``to_broadcast(notifiable)`` returns.

    Attributes:
        data: the JSON object the browser receives (``event.data``, parsed).
        event: the SSE event name (``addEventListener(name, ...)``); default
            ``"notification"``.
        channels: channels to publish on instead of the notifiable's own (its
            ``route_notification_for_broadcast``, else ``private-<Class>.<id>``).
    """

    data: dict[str, Any] = field(default_factory=dict)
    event: str | None = None
    channels: list[str] | None = None

    def as_event(self, name: str) -> BroadcastMessage:
        """Name the SSE event."""
        self.event = name
        return self

    def on(self, *channels: str) -> BroadcastMessage:
        """Publish on these channels."""
        self.channels = [check_channel(c, "BroadcastMessage.on()") for c in channels]
        return self
