"""Class paths that queued payloads carry must survive refactors. No sockets.

A payload names a class ``module:QualName`` (``serializer.class_path``). Splitting a
module must leave every class that can travel in a payload where it was (or set its
``__module__`` back), or payloads queued by an older version stop resolving.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.unit.test_serializer import resolve
from tidings.events.call_queued import CallQueuedListener
from tidings.notifications.messages import Attachment, RenderedMail, SmsMessage, WebhookMessage
from tidings.notifications.queued import SendQueuedNotification
from tidings.wire.serializer import class_path, decode, encode

STABLE = [
    (Attachment, "tidings.notifications.messages:Attachment"),
    (RenderedMail, "tidings.notifications.messages:RenderedMail"),
    (SmsMessage, "tidings.notifications.messages:SmsMessage"),
    (WebhookMessage, "tidings.notifications.messages:WebhookMessage"),
    (CallQueuedListener, "tidings.events.call_queued:CallQueuedListener"),
    (SendQueuedNotification, "tidings.notifications.queued:SendQueuedNotification"),
]


@pytest.mark.parametrize(("cls", "path"), STABLE, ids=[path for _, path in STABLE])
def test_class_path_is_unchanged_and_resolves(cls: type[Any], path: str) -> None:
    assert class_path(cls) == path
    assert resolve(path) is cls


def test_a_message_queued_under_its_old_path_decodes() -> None:
    fields = {"content": "hi", "sender": "Acme"}
    queued = {"__t": "dc", "c": "tidings.notifications.messages:SmsMessage", "f": fields}
    assert decode(orjson.loads(orjson.dumps(queued)), resolve) == SmsMessage("hi", sender="Acme")
    assert encode(SmsMessage("hi", sender="Acme")) == queued
