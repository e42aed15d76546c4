"""Broadcasting to browsers: events and notifications pushed over Server-Sent Events.

::

    @dataclass
    class OrderShipped(ShouldBroadcast):
        order_id: int
        user_id: int
        def broadcast_on(self): return [f"private-orders.{self.order_id}"]

    app.broadcasting.channel("orders.{order_id}")(lambda user, order_id: ...)
    app.dispatch(OrderShipped(42, 7))     # queued, then one XADD per channel

A message is written once to a Redis Stream per channel (``MAXLEN ~``, bounded) and
every web process serving :func:`~tidings.broadcasting.sse.broadcast_app` reads it with
one ``XREAD BLOCK`` for all its connected browsers (see docs/broadcasting.md).
"""

from tidings.broadcasting.events import BroadcastEvent, ShouldBroadcast
from tidings.broadcasting.messages import BroadcastMessage, check_channel, is_private
from tidings.broadcasting.registry import Broadcasting

__all__ = [
    "BroadcastEvent",
    "BroadcastMessage",
    "Broadcasting",
    "ShouldBroadcast",
    "check_channel",
    "is_private",
]
