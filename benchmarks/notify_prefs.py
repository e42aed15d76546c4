"""Digests and preferences figures (issue 27).

    .venv/bin/python -m benchmarks.notify_prefs [--notifiables 1000] [--items 10000]
        [--window 20] [--n 400] [--rounds 5] [--backends sqlite,postgresql]

1. **Digest**: ``--items`` notifications (``digest = timedelta(seconds=--window)``, mail)
   for ``--notifiables`` recipients, round-robin, so every recipient's window opens within
   the first ``--notifiables`` items and all items land in one window each. An in-process
   worker (``--concurrency 32``) sends the digests to aiosmtpd on loopback. Printed:
   mails received (must equal the recipients), item lines in them (must equal the items,
   each once), the enqueue rate, and the time from window end (the last window's, and
   the first's) to the last digest delivered.
2. **Preferences on notify()**: ``notify()`` of a queued mail+SMS notification, with
   preferences off, and with ``preferences.use_database()`` on SQLite and PostgreSQL
   (each recipient has one stored opt-out row, so the lookup finds something), one
   recipient per call and 100 per call; rounds interleaved (the order rotates each
   round), and the same with ``use_database(cache_s=30)`` (``+cache``: warm after the
   first round). Printed: median µs per notify() (and per recipient), min-max spread,
   ratio to off.

Redis: a throwaway server (benchmarks/_redis.py). PostgreSQL as in bench_database.py
(``TIDINGS_BENCH_POSTGRES_URL``, else a private cluster). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import email
import email.policy
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from benchmarks._redis import bench_redis, delete_prefix  # noqa: E402
from tests.support.smtp import Recorder, SmtpServer  # noqa: E402
from tidings import App, ShouldQueue  # noqa: E402
from tidings.notifications import (  # noqa: E402
    MailMessage,
    Notifiable,
    Notification,
    NotificationDigested,
    SmsMessage,
)
from tidings.worker.worker import Worker, WorkerOptions  # noqa: E402

KEY = "bench-notify-prefs-key-0123456789abcdef"


@dataclass
class Member(Notifiable):
    id: int
    email: str = ""
    phone: str = ""

    def __post_init__(self) -> None:
        self.email = f"member{self.id}@example.org"
        self.phone = f"+1555{self.id:07d}"


@dataclass
class Comment(Notification, ShouldQueue):
    n: int
    WINDOW_S: ClassVar[float] = 20.0

    def via(self, notifiable: Any) -> list[str]:
        return ["mail"]

    @property
    def digest(self) -> timedelta:
        return timedelta(seconds=self.WINDOW_S)

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(f"Comment {self.n}")


@dataclass
class Plain(Notification, ShouldQueue):
    n: int

    def via(self, notifiable: Any) -> list[str]:
        return ["mail"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(f"Plain {self.n}")


@dataclass
class Promo(Notification, ShouldQueue):
    text: str = "sale"

    def via(self, notifiable: Any) -> list[str]:
        return ["mail", "sms"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(self.text)

    def to_sms(self, notifiable: Any) -> SmsMessage:
        return SmsMessage(self.text)


class StampingRecorder(Recorder):
    """Records when each message arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: list[float] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        reply = await super().handle_DATA(server, session, envelope)
        self.arrived.append(time.time())
        return reply


def _wipe(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        delete_prefix(client, prefix)
    finally:
        client.close()


def make_app(redis_url: str, prefix: str, **kw: Any) -> App:
    return App(env=False, redis_url=redis_url, key=KEY, prefix=prefix,
               allowed_modules="benchmarks", **kw)  # fmt: skip


# -- 1. digests ---------------------------------------------------------------------------------


def bench_digest(redis_url: str, recipients: int, items: int, window_s: float) -> None:
    Comment.WINDOW_S = window_s
    recorder = StampingRecorder()
    with SmtpServer(recorder=recorder) as smtp:
        app = make_app(
            redis_url, "benchdigest", mail_url=f"smtp://127.0.0.1:{smtp.port}?tls=off&pool=8"
        )
        opened: list[float] = []
        app.listen(NotificationDigested, lambda e: opened.append(time.time()) if e.opened else None)
        try:
            app.make_current()
            members = [Member(i) for i in range(recipients)]
            t0 = time.perf_counter()
            for i in range(items):
                members[i % recipients].notify(Comment(i))
            enqueue_s = time.perf_counter() - t0
            if enqueue_s > window_s:
                print(f"WARNING: enqueue took {enqueue_s:.1f} s > window {window_s:g} s: "
                      "late items open second windows (raise --window)")  # fmt: skip
            opts = WorkerOptions(stop_when_empty=True, sleep_s=0.05, timeout_s=120.0,
                                 concurrency=32)  # fmt: skip
            code = asyncio.run(Worker(app, opts).run())
            if code != 0:
                raise RuntimeError(f"worker exited {code}")
            lines: list[str] = []
            for received in smtp.messages:
                msg = email.message_from_bytes(received.data, policy=email.policy.default)
                body = msg.get_body(preferencelist=("plain",))
                lines += re.findall(r"Comment (\d+)", str(body.get_content() if body else ""))
            first_end, last_end = min(opened) + window_s, max(opened) + window_s
            last = max(recorder.arrived)
            print("\n## digest: one window per recipient, delivered over SMTP (aiosmtpd)")
            print(f"recipients {recipients:,}, items {items:,}, window {window_s:g} s, "
                  f"windows opened {len(opened):,}")  # fmt: skip
            print(f"enqueue: {items / enqueue_s:,.0f} items/s ({enqueue_s:.2f} s)")
            print(f"mails received: {len(smtp.messages):,} (must be {recipients:,})")
            print(f"item lines in them: {len(lines):,}, distinct {len(set(lines)):,} "
                  f"(must be {items:,})")  # fmt: skip
            print(f"last window end -> last digest delivered: {last - last_end:.2f} s")
            print(f"first window end -> last digest delivered: {last - first_end:.2f} s")

            # Baseline, same worker options and SMTP server: one plain mail per recipient
            # (no digest), timed from the worker's start to the last mail received.
            for member in members:
                member.notify(Plain(member.id))
            recorder.arrived.clear()
            t_start = time.time()
            code = asyncio.run(Worker(app, opts).run())
            if code != 0:
                raise RuntimeError(f"worker exited {code}")
            plain_s = max(recorder.arrived) - t_start
            print(f"baseline, {recipients:,} plain mails (no digest), worker start -> last "
                  f"delivered: {plain_s:.2f} s ({recipients / plain_s:,.0f} mails/s); digests: "
                  f"{recipients / (last - first_end):,.0f} digests/s")  # fmt: skip
        finally:
            _wipe(redis_url, "benchdigest")
            app.close()


# -- 2. preferences ------------------------------------------------------------------------------


def notify_us(app: App, members: list[Member], per_call: int, calls: int) -> float:
    """Median-free: total µs per notify() over ``calls`` calls."""
    app.make_current()
    t0 = time.perf_counter()
    for c in range(calls):
        start = (c * per_call) % len(members)
        app.notify(members[start : start + per_call], Promo())
    return (time.perf_counter() - t0) / calls * 1e6


def bench_preferences(redis_url: str, urls: dict[str, str], n: int, rounds: int) -> None:
    members = [Member(i) for i in range(1000)]
    apps: dict[str, App] = {"off": make_app(redis_url, "benchprefs-off")}
    variants = [(name, url, 0.0) for name, url in urls.items()]
    variants += [(f"{name}+cache", url, 30.0) for name, url in urls.items()]
    for name, url, cache_s in variants:
        app = make_app(redis_url, f"benchprefs-{name}", database_url=url)
        app.notifications.preferences.use_database(cache_s=cache_s)
        app.database.upgrade()
        with app.database.engine.begin() as conn:
            conn.execute(app.database.preferences_table.delete())
        app.make_current()
        for m in members:  # one stored row each: an SMS opt-out of another type
            m.opt_out("bench.Other", "sms")
        apps[name] = app
    print("\n## preferences on notify(): µs per call (median of rounds; min-max)")
    print(f"{n} calls per round, {rounds} rounds, order rotated each round; queued jobs "
          "deleted between rounds")  # fmt: skip
    for per_call in (1, 100):
        calls = n if per_call == 1 else max(10, n // 20)
        got: dict[str, list[float]] = {k: [] for k in apps}
        names = list(apps)
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                got[name].append(notify_us(apps[name], members, per_call, calls))
                _wipe(redis_url, f"benchprefs-{name}")
        base = statistics.median(got["off"])
        print(f"\n{per_call} recipient(s) per notify(), {calls} calls:")
        for name, values in got.items():
            med = statistics.median(values)
            spread = f"{min(values):,.0f}-{max(values):,.0f}"
            print(f"  {name:<17} {med:>9,.0f} µs/call  ({med / per_call:>7,.0f} µs/recipient)"
                  f"  spread {spread}  ratio {med / base:.2f}x")  # fmt: skip
    for app in apps.values():
        app.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--notifiables", type=int, default=1000)
    parser.add_argument("--items", type=int, default=10000)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--skip-digest", action="store_true")
    args = parser.parse_args()
    print(f"# notify_prefs: cpus={os.cpu_count()}, load {os.getloadavg()[0]:.1f} "
          "(a shared machine: read ratios, not absolute rates)")  # fmt: skip
    with bench_redis() as server, tempfile.TemporaryDirectory() as tmp:
        if not args.skip_digest:
            bench_digest(server.url, args.notifiables, args.items, args.window)
        urls: dict[str, str] = {}
        owned: Any = None
        backends = args.backends.split(",")
        if "sqlite" in backends:
            urls["sqlite"] = f"sqlite:///{tmp}/prefs.sqlite3"
        try:
            if "postgresql" in backends:
                from benchmarks.bench_database import postgres_url

                urls["postgresql"], owned = postgres_url()
            bench_preferences(server.url, urls, args.n, args.rounds)
        finally:
            if owned:
                db, cluster = owned
                db.drop()
                if cluster is not None:
                    cluster.stop()
        print(f"\nload after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
