"""Locks the public names (as httpx does): adding or removing one is a decision.

If a test here fails because you exported a new name on purpose, add it to the lists
below in the same change, so the public surface only ever changes deliberately.
"""

from __future__ import annotations

import importlib
import types

import pytest

import tidings
import tidings.notifications
import tidings.testing

PUBLIC: dict[str, set[str]] = {
    "tidings": {
        "App",
        "BatchClosed",
        "CallQueuedListener",
        "ChannelError",
        "ConfigurationError",
        "Dispatcher",
        "Event",
        "Exponential",
        "Job",
        "JobCancelled",
        "JobFailedError",
        "JobNotFound",
        "ResultMissing",
        "ResultTooLarge",
        "Listener",
        "PayloadTooLarge",
        "PendingDispatch",
        "Pool",
        "QueueUnavailable",
        "RateLimited",
        "SerializationError",
        "ShouldBeEncrypted",
        "ShouldQueue",
        "Skip",
        "ThrottlesExceptions",
        "TidingsError",
        "ValidationError",
        "WithoutOverlapping",
        "batch",
        "chain",
        "dispatch",
        "event",
        "listen",
        "queued",
    },
    "tidings.notifications": {
        "AnonymousNotifiable",
        "DatabaseNotification",
        "MailMessage",
        "Notifiable",
        "Notification",
        "NotificationDelayed",
        "NotificationDigested",
        "NotificationFailed",
        "NotificationSending",
        "NotificationSent",
        "NotificationSkipped",
        "SendQueuedNotification",
        "SlackMessage",
        "SmsMessage",
        "WebhookEndpoint",
        "WebhookMessage",
        "route",
        "verify_webhook",
    },
    "tidings.testing": {
        "FakeDispatcher",
        "FakeNotifications",
        "FakeQueue",
        "fake_events",
        "fake_notifications",
        "fake_queue",
    },
}

# The names DESIGN.md ("Public API") promises; these may never go away.
PROMISED: dict[str, set[str]] = {
    "tidings": {
        "App",
        "Event",
        "Listener",
        "ShouldQueue",
        "Job",
        "event",
        "dispatch",
        "listen",
        "chain",
        "SerializationError",
        "ConfigurationError",
        "TidingsError",
    },
    "tidings.notifications": {
        "Notification",
        "Notifiable",
        "MailMessage",
        "SmsMessage",
        "WebhookMessage",
        "route",
    },
    "tidings.testing": {"fake_events", "fake_queue", "fake_notifications"},
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_locked(module: str) -> None:
    exported = importlib.import_module(module).__all__
    assert len(exported) == len(set(exported)), f"{module}.__all__ has duplicates"
    added = set(exported) - PUBLIC[module]
    removed = PUBLIC[module] - set(exported)
    assert not added and not removed, (
        f"{module}.__all__ changed: added {sorted(added)}, removed {sorted(removed)}; "
        "update tests/unit/test_public_api.py if that was on purpose"
    )


@pytest.mark.parametrize("module", sorted(PROMISED))
def test_the_names_the_design_promises_are_exported(module: str) -> None:
    assert PROMISED[module] <= set(importlib.import_module(module).__all__)


@pytest.mark.parametrize(
    ("module", "name"), [(m, n) for m in sorted(PUBLIC) for n in sorted(PUBLIC[m])]
)
def test_each_name_is_importable_and_belongs_to_tidings(module: str, name: str) -> None:
    obj = getattr(importlib.import_module(module), name)
    assert obj is not None
    assert not isinstance(obj, types.ModuleType), f"{module}.{name} is a module"
    # Re-exported from tidings' own modules, never a third-party object.
    owner = getattr(obj, "__module__", None) or ""
    assert owner == "tidings" or owner.startswith("tidings."), (name, owner)


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_star_import_gives_exactly_all(module: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module} import *", namespace)
    namespace.pop("__builtins__", None)
    assert set(namespace) == set(importlib.import_module(module).__all__)


def test_every_exported_error_is_a_tidings_error() -> None:
    for name in tidings.__all__:
        obj = getattr(tidings, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, tidings.TidingsError), name
