"""pytest fixtures ``fake_events``, ``fake_queue`` and ``fake_notifications`` on the current App."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tidings import testing


@pytest.fixture(name="fake_events")
def _fake_events() -> Iterator[Any]:
    from tidings.app import App

    with testing.fake_events(App.current()) as fake:
        yield fake


@pytest.fixture(name="fake_queue")
def _fake_queue() -> Iterator[testing.FakeQueue]:
    with testing.fake_queue() as fake:
        yield fake


@pytest.fixture(name="fake_notifications")
def _fake_notifications() -> Iterator[testing.FakeNotifications]:
    with testing.fake_notifications() as fake:
        yield fake
