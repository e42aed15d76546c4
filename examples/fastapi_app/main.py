"""The tidings FastAPI example: Pydantic events, SQLAlchemy models as arguments, the
lifespan helper and ``await app.dispatch_async(e)``.

Run: ``uvicorn main:api`` and ``notify-worker -A main:tidings`` (see README.md).
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from starlette.concurrency import run_in_threadpool

from tidings import App, Listener, ShouldQueue
from tidings.contrib.fastapi import lifespan
from tidings.contrib.sqlalchemy import use_sessions
from tidings.notifications import MailMessage, Notifiable, Notification

engine = create_engine(os.environ.get("DATABASE_URL") or "sqlite:///fastapi_app.db")
Session = sessionmaker(engine)


class Base(DeclarativeBase):
    pass


class User(Notifiable, Base):
    """A SQLAlchemy model that receives notifications (queued by primary key)."""

    __tablename__ = "users"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)
    name: Mapped[str] = mapped_column(String(100))


class SignupIn(BaseModel):
    email: str
    name: str = "friend"


class UserRegistered(BaseModel):
    """A Pydantic event: queued as its JSON form, validated again in the worker."""

    user_id: int
    email: str


class Welcome(Notification, ShouldQueue):
    def via(self, user: User) -> list[str]:
        return ["mail"]

    def to_mail(self, user: User) -> MailMessage:
        return MailMessage().subject("Welcome to myapp").greeting(f"Hello {user.name}!")


class SendWelcome(Listener, ShouldQueue):
    def handle(self, e: UserRegistered) -> None:
        with Session() as session:
            user = session.get(User, e.user_id)
            if user is not None:
                user.notify(Welcome())  # the User goes by primary key, reloaded in the worker


tidings = App.from_env(mail_allow_test_domains=True)
tidings.listen(UserRegistered, SendWelcome)
use_sessions(Session)  # how the worker loads User arguments
Base.metadata.create_all(engine)

api = FastAPI(lifespan=lifespan(tidings))


def _create_user(body: SignupIn) -> int:
    with Session.begin() as session:
        user = User(email=body.email, name=body.name)
        session.add(user)
        session.flush()
        return user.id


@api.post("/signup", status_code=201)
async def signup(body: SignupIn) -> dict[str, int]:
    user_id = await run_in_threadpool(_create_user, body)  # committed here
    await tidings.dispatch_async(UserRegistered(user_id=user_id, email=body.email))
    return {"id": user_id}
