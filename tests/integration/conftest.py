"""Fixtures of the integration tests that need more than tests/conftest.py gives.

``servers`` (aiosmtpd + an SMS stub + a webhook receiver) and ``app_factory`` (an App on
them) live in notify_support.py beside the notification classes they go with.
"""

from tests.integration.notify_support import app_factory, servers

__all__ = ["app_factory", "servers"]
