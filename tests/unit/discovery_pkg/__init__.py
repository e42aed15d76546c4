"""Listener modules found by ``Dispatcher.discover`` in tests/unit/test_dispatcher.py."""
