"""Delivery rules decided at ``notify()``: preferences, throttling, digests, quiet hours.

See :mod:`.plan` for the order they apply in, and each module for its rule:
:mod:`.preferences`, :mod:`.throttling`, :mod:`.digests`, :mod:`.quiet_hours`.
"""
