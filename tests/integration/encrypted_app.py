"""Jobs, listeners and notifications of the encrypted-payload tests (module level, so a
worker resolves them). ``SEEN`` records what handlers received, in clear."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from tidings import Job, Listener, ShouldQueue
from tidings.notifications import Notifiable, Notification
from tidings.wire.encryption import ShouldBeEncrypted

SEEN: list[Any] = []
SECRET_EMAIL = "hidden.person.4711@example.org"
SECRET_SSN = "078-05-1120-NOT-IN-REDIS"


@dataclass
class Sealed(Job, ShouldBeEncrypted):
    email: str
    ssn: str

    def handle(self) -> None:
        SEEN.append((self.email, self.ssn))


@dataclass
class SealedFails(Job, ShouldBeEncrypted):
    email: str
    tries: ClassVar[int | None] = 1

    def handle(self) -> None:
        raise RuntimeError("refused by the handler")  # no data in the text


@dataclass
class Plain(Job):
    email: str

    def handle(self) -> None:
        SEEN.append(self.email)


@dataclass
class Registered:
    email: str


class AuditRegistration(Listener, ShouldQueue, ShouldBeEncrypted):
    def handle(self, event: Registered) -> None:
        SEEN.append(("audit", event.email))


@dataclass
class Patient(Notifiable):
    id: int
    email: str


@dataclass
class LabResults(Notification, ShouldQueue, ShouldBeEncrypted):
    result: str

    def via(self, notifiable: Any) -> list[str]:
        return ["probe"]


class ProbeChannel:
    async def send(self, notifiable: Any, notification: Any) -> str:
        SEEN.append(("probe", notifiable.email, notification.result))
        return "ok"
