"""The tidings Flask example: the ``Tidings`` extension, SQLAlchemy sessions with
after-commit dispatch, a mapped object in an event.

Run: ``flask --app wsgi run`` and ``notify-worker -A wsgi:tidings_app`` (see README.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from flask import Flask, request
from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from tidings import Listener, ShouldQueue, event
from tidings.contrib.flask import Tidings
from tidings.contrib.sqlalchemy import use_sessions
from tidings.notifications import MailMessage, Notification, route

engine = create_engine(os.environ.get("DATABASE_URL") or "sqlite:///flask_app.db")
Session = sessionmaker(engine)
tidings = Tidings()


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))
    item: Mapped[str] = mapped_column(String(100))


@dataclass
class OrderPlaced:
    order: Order  # a mapped object: queued by primary key, reloaded in the worker


class Receipt(Notification, ShouldQueue):
    def __init__(self, order: Order) -> None:
        self.order = order

    def via(self, notifiable: object) -> list[str]:
        return ["mail"]

    def to_mail(self, notifiable: object) -> MailMessage:
        return (
            MailMessage().subject(f"Order {self.order.id}").line(f"You bought {self.order.item}.")
        )


class SendReceipt(Listener, ShouldQueue):
    after_commit = True  # pushed when the order's transaction commits; dropped on rollback

    def handle(self, e: OrderPlaced) -> None:
        route("mail", e.order.email).notify(Receipt(e.order))


class RolledBack(Exception):
    """Raised to roll the order back (``rollback=1``)."""


def create_app() -> Flask:
    app = Flask(__name__)
    app.config["TIDINGS_MAIL_ALLOW_TEST_DOMAINS"] = True
    app.config.from_prefixed_env("SHOP")  # e.g. SHOP_TIDINGS_MAIL_URL=smtp://...
    tidings.init_app(app)
    tidings.app.listen(OrderPlaced, SendReceipt)
    use_sessions(Session)
    Base.metadata.create_all(engine)

    @app.post("/orders")
    def place_order() -> tuple[dict[str, object], int]:
        try:
            with Session.begin() as session:
                order = Order(email=request.form["email"], item=request.form["item"])
                session.add(order)
                session.flush()
                event(OrderPlaced(order))  # held until the commit at the end of this block
                if request.form.get("rollback"):
                    raise RolledBack
                order_id = order.id
        except RolledBack:
            return {"rolled_back": True}, 409
        return {"id": order_id}, 201

    return app
