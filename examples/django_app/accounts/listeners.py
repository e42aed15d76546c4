"""Discovered by tidings.contrib.django: every Listener here is registered for the event
its ``handle`` takes."""

from accounts.events import UserRegistered
from accounts.notifications import Welcome
from tidings import Listener, ShouldQueue


class SendWelcome(Listener, ShouldQueue):
    """Runs in notify-worker: ``e.user`` is the row, loaded fresh by primary key."""

    tries = 3

    def handle(self, e: UserRegistered) -> None:
        e.user.notify(Welcome())
        e.user.welcomed = True
        e.user.save(update_fields=["welcomed"])
