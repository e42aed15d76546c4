"""Database-channel and encrypted-payload figures (issue 17).

    .venv/bin/python -m benchmarks.bench_database [--n 2000] [--rounds 3]

1. **Database channel**: N queued notifications (``via() == ["database"]``) drained by an
   in-process worker (``--concurrency 32``) into SQLite, PostgreSQL and MariaDB, as
   rows/s, beside two baselines on the same table shape in the same run: one
   ``executemany`` of N rows in one transaction (the database's ceiling), one INSERT +
   COMMIT per row (what a channel without group commit would do), and the same
   notifications on a channel that does nothing (the queue's ceiling).
2. **Encryption**: the drain of N no-op jobs, plain against ``ShouldBeEncrypted``,
   rounds interleaved, as jobs/s and the extra microseconds per job; and the seal + open
   cost of one payload alone.

Redis: a throwaway server (``benchmarks/_redis.py``). PostgreSQL: ``TIDINGS_BENCH_POSTGRES_URL``,
else the server on 127.0.0.1:5432, else a private cluster (tests/support/pg_database.py),
in a database of its own that is dropped after. MariaDB: ``TIDINGS_BENCH_MYSQL_URL``
(an SQLAlchemy URL), else a private mariadbd (tests/support/mariadb.py, PyMySQL), in a
database of its own. ``--backends sqlite,mariadb`` picks some; ``--no-encryption`` skips
part 2. Nothing is asserted; on a shared machine read the ratios, not the absolute rates.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from benchmarks._redis import bench_redis, delete_prefix  # noqa: E402
from tidings import App, Job, ShouldBeEncrypted, ShouldQueue  # noqa: E402
from tidings.notifications import Notifiable, Notification  # noqa: E402
from tidings.notifications.channels.database import NotificationStore  # noqa: E402
from tidings.worker.worker import Worker, WorkerOptions  # noqa: E402

KEY = "bench-database-key-0123456789abcdef"


@dataclass
class Member(Notifiable):
    id: int


@dataclass
class Paid(Notification, ShouldQueue):
    invoice: int

    def via(self, notifiable: Any) -> list[str]:
        return ["database"]

    def to_database(self, notifiable: Any) -> dict[str, Any]:
        return {"invoice": self.invoice, "amount": "12.50", "currency": "EUR"}


@dataclass
class PaidNowhere(Paid):
    """The same notification on a channel that does nothing: the queue's own ceiling."""

    def via(self, notifiable: Any) -> list[str]:
        return ["nowhere"]


class Nowhere:
    async def send(self, notifiable: Any, notification: Any) -> None:
        return None


@dataclass
class Noop(Job):
    n: int
    email: str = "someone@example.org"

    async def handle(self) -> None:
        return None


@dataclass
class SealedNoop(Noop, ShouldBeEncrypted):
    pass


def drain(app: App, concurrency: int) -> None:
    app.make_current()
    opts = WorkerOptions(stop_when_empty=True, sleep_s=0.2, timeout_s=60.0, concurrency=concurrency)
    code = asyncio.run(Worker(app, opts).run())
    if code != 0:
        raise RuntimeError(f"worker exited {code}")


def make_app(redis_url: str, prefix: str, **kw: Any) -> App:
    return App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules="benchmarks",
        **kw,
    )


def rows_for(n: int) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    return [
        {
            "id": uuid.uuid4().hex, "type": "bench.Paid", "notifiable_type": "bench.Member",
            "notifiable_id": str(i % 100),
            "data": {"invoice": i, "amount": "12.50", "currency": "EUR"},
            "read_at": None, "created_at": now,
        }
        for i in range(n)
    ]  # fmt: skip


def reset(store: NotificationStore) -> None:
    store.upgrade()
    with store.engine.begin() as conn:
        conn.execute(store.table.delete())


def executemany_rate(store: NotificationStore, n: int) -> float:
    reset(store)
    rows = rows_for(n)
    t0 = time.perf_counter()
    with store.engine.begin() as conn:
        conn.execute(store.table.insert(), rows)
    return n / (time.perf_counter() - t0)


def per_row_rate(store: NotificationStore, n: int) -> float:
    reset(store)
    rows = rows_for(n)
    t0 = time.perf_counter()
    for row in rows:
        with store.engine.begin() as conn:
            conn.execute(store.table.insert(), [row])
    return n / (time.perf_counter() - t0)


def queue_rate(
    redis_url: str, database_url: str, n: int, concurrency: int, nowhere: bool = False
) -> float:
    prefix = f"benchdb{uuid.uuid4().hex[:6]}"
    app = make_app(redis_url, prefix, database_url=database_url)
    app.extend_channel("nowhere", Nowhere)
    try:
        reset(app.database)
        app.notify([Member(i) for i in range(n)], PaidNowhere(1) if nowhere else Paid(1))
        t0 = time.perf_counter()
        drain(app, concurrency)
        elapsed = time.perf_counter() - t0
        stored = app.database.count()
        if stored != (0 if nowhere else n):
            raise RuntimeError(f"stored {stored} of {n}")
        return n / elapsed
    finally:
        import redis

        client = redis.Redis.from_url(redis_url)
        delete_prefix(client, prefix)
        client.close()
        app.close()


def drain_rate(redis_url: str, cls: type[Noop], n: int) -> float:
    prefix = f"benchenc{uuid.uuid4().hex[:6]}"
    app = make_app(redis_url, prefix)
    try:
        app.dispatch_many([cls(i) for i in range(n)])
        t0 = time.perf_counter()
        drain(app, 16)
        return n / (time.perf_counter() - t0)
    finally:
        import redis

        client = redis.Redis.from_url(redis_url)
        delete_prefix(client, prefix)
        client.close()
        app.close()


def postgres_url() -> tuple[str, Any]:
    url = os.environ.get("TIDINGS_BENCH_POSTGRES_URL")
    if url:
        return url, None
    from tests.support.pg_database import TestDatabase, postgres_admin_url

    admin, cluster = postgres_admin_url()
    db = TestDatabase(admin).create()
    return db.sqlalchemy_url, (db, cluster)


def mysql_url() -> tuple[str, Any]:
    url = os.environ.get("TIDINGS_BENCH_MYSQL_URL")
    if url:
        return url, None
    from tests.support.mariadb import MariaDBServer, MySQLDatabase

    server = MariaDBServer().start()
    db = MySQLDatabase(server.admin_url).create()
    return db.sqlalchemy_url, (db, server)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgresql,mariadb")
    parser.add_argument("--no-encryption", action="store_true")
    args = parser.parse_args()
    n, rounds = args.n, args.rounds
    backends = args.backends.split(",")
    print(f"# bench_database: n={n}, rounds={rounds} (medians), cpus={os.cpu_count()}")
    with bench_redis() as server, tempfile.TemporaryDirectory() as tmp:
        owned: list[tuple[Any, Any]] = []
        try:
            targets: dict[str, str] = {}
            if "sqlite" in backends:
                targets["sqlite"] = f"sqlite:///{tmp}/bench.sqlite3"
            if "postgresql" in backends:
                targets["postgresql"], pg_owned = postgres_url()
                owned += [pg_owned] if pg_owned else []
            if "mariadb" in backends:
                targets["mariadb"], my_owned = mysql_url()
                owned += [my_owned] if my_owned else []
            print("\n## database channel: notifications stored per second")
            head = f"{'backend':<11} {'queue+worker':>13} {'executemany':>12} {'row+commit':>11}"
            print(f"{head} {'no-op channel':>14}  queue/executemany  queue/no-op")
            for name, url in targets.items():
                store = NotificationStore(url)
                got: dict[str, list[float]] = {"queue": [], "many": [], "row": [], "noop": []}
                for _ in range(rounds):
                    got["queue"].append(queue_rate(server.url, url, n, 32))
                    got["many"].append(executemany_rate(store, n))
                    got["row"].append(per_row_rate(store, min(n, 500)))
                    got["noop"].append(queue_rate(server.url, url, n, 32, nowhere=True))
                q, m, r, z = (statistics.median(got[k]) for k in ("queue", "many", "row", "noop"))
                print(
                    f"{name:<11} {q:>11,.0f}/s {m:>10,.0f}/s {r:>9,.0f}/s {z:>12,.0f}/s"
                    f"  {q / m:>17.2f}  {q / z:>11.2f}"
                )
                store.close()

            if args.no_encryption:
                return 0
            print(
                "\n## encryption: drain of no-op jobs (--concurrency 16), "
                f"{2 * rounds} rounds each, ABBA"
            )
            plain: list[float] = []
            sealed: list[float] = []
            for i in range(2 * rounds):  # ABBA: neither case always runs first
                first, second = (Noop, SealedNoop) if i % 2 == 0 else (SealedNoop, Noop)
                for cls in (first, second):
                    rate = drain_rate(server.url, cls, n)
                    (sealed if cls is SealedNoop else plain).append(rate)
            p, s = statistics.median(plain), statistics.median(sealed)
            extra_us = (1 / s - 1 / p) * 1e6
            print(f"plain      {p:>9,.0f} jobs/s")
            print(f"encrypted  {s:>9,.0f} jobs/s  ({s / p:.2f}x, {extra_us:+.0f} µs/job)")
            app = make_app(server.url, "benchseal")
            from tidings.wire.encryption import aad_for
            from tidings.wire.serializer import encode

            data = encode(SealedNoop(1))
            aad = aad_for("0" * 32, "x:y")
            t0 = time.perf_counter()
            for _ in range(5000):
                app.keyring.open(app.keyring.seal(data, aad), aad)
            one = (time.perf_counter() - t0) / 5000 * 1e6
            print(f"seal + open of one payload alone: {one:.1f} µs")
            app.close()
        finally:
            for db, server_ in owned:
                db.drop()
                if server_ is not None:
                    server_.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
