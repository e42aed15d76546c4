"""Django's Tasks API on tidings beside the published backends a Django user would pick
instead (issue 24), one run, the same Redis and database servers:

    python -m benchmarks.django_tasks_peers [--tasks 10000] [--peer-tasks 2000]
        [--rq-tasks 1000] [--rounds 1]

* ``tidings``: ``TidingsBackend``, drained by ``notify-worker --stop-when-empty``
  (one process, its default concurrency 16);
* ``db-sqlite`` / ``db-postgres``: ``django-tasks-db``'s ``DatabaseBackend`` on a SQLite
  file and on a private PostgreSQL (``initdb``/``pg_ctl``, fsync off: the database's
  best case), drained by ``manage.py db_worker --batch --interval 0``;
* ``rq`` / ``rq-simple``: ``django-tasks-rq``'s ``RQBackend`` on the same Redis, drained
  by ``manage.py rqworker --burst --job-class django_tasks_rq.Job`` (RQ's default
  worker forks a work horse per job; ``rq-simple`` runs them in the worker,
  ``--worker-class rq.worker.SimpleWorker``, RQ's fastest).

Every backend runs the same no-op task (``benchmarks/_django_noop.py``) through
``noop.enqueue(i)``. Enqueue: N calls in one process. Drain: N over the time from the
first task's ``started_at`` to the last one's ``finished_at``, as each backend's
``get_result()`` reports them (the worker's start-up is left out; its whole wall time is
printed too). The last task's ``get_result()`` must be SUCCESSFUL, or the row says so.
``django-tasks-redis`` is not here: every release needs Python >= 3.12 (this machine has
3.11).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._redis import bench_redis

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = "benchmarks._django_peer_settings"


def _env(peer: str, redis_url: str, db: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")}
    env.update(
        DJANGO_SETTINGS_MODULE=SETTINGS,
        PEER_BACKEND=peer,
        PEER_REDIS_URL=redis_url,
        PEER_DB=db,
        PEER_PREFIX=f"peers{os.getpid()}",
        PYTHONPATH=str(ROOT),
    )
    return env


def _worker_cmd(variant: str) -> list[str]:
    py = sys.executable
    if variant == "tidings":
        return [str(Path(py).parent / "notify-worker"), "--queue", "default", "--stop-when-empty"]
    if variant.startswith("db"):
        return [py, "-m", "django", "db_worker", "--batch", "--interval", "0",
                "--no-startup-delay"]  # fmt: skip
    cmd = [py, "-m", "django", "rqworker", "--burst", "--job-class", "django_tasks_rq.Job"]
    if variant == "rq-simple":
        cmd += ["--worker-class", "rq.worker.SimpleWorker"]
    return [*cmd, "default"]


def _timed(cmd: list[str], env: dict[str, str], timeout: float = 1800) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        cmd, env=env, cwd=ROOT, check=True, timeout=timeout,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    return time.perf_counter() - t0


def _child(what: str, env: dict[str, str], n: int = 0) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.django_tasks_peers", "--child", what, "--tasks", str(n)],
        env=env, cwd=ROOT, check=True, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def child(what: str, n: int) -> None:
    """In a process of its own, with ``PEER_*`` set: migrate, enqueue N, or check."""
    import django

    django.setup()
    if what == "migrate":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        print(json.dumps({}))
        return
    from benchmarks._django_noop import noop

    if what == "enqueue":
        noop.enqueue(-1)  # warm: connections, imports
        t0 = time.perf_counter()
        first = last = noop.enqueue(0)
        for i in range(1, n):
            last = noop.enqueue(i)
        rate = n / (time.perf_counter() - t0)
        print(json.dumps({"rate": rate, "first": first.id, "last": last.id}))
    else:  # check: the first and last tasks' results
        _, first_id, last_id = what.split(":")
        first, last = noop.get_result(first_id), noop.get_result(last_id)
        span = (last.finished_at - first.started_at).total_seconds()
        print(json.dumps({"status": str(last.status), "value": last.return_value, "span": span}))


def measure(variant: str, n: int, redis_url: str, db: str) -> dict[str, Any]:
    peer = variant.split("-")[0]
    env = _env(peer, redis_url, db)
    if peer == "db":
        _child("migrate", env)
    cmd = _worker_cmd(variant)
    enq = _child("enqueue", env, n)
    wall = _timed(cmd, env)
    check = _child(f"check:{enq['first']}:{enq['last']}", env)
    ok = check["status"].endswith("SUCCESSFUL") and check["value"] == n - 1
    return {
        "variant": variant,
        "n": n,
        "enqueue": enq["rate"],
        "drain": n / check["span"],
        "worker_wall_s": wall,
        "ok": ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10000, help="N for tidings")
    parser.add_argument("--peer-tasks", type=int, default=2000, help="N for the db backend")
    parser.add_argument("--rq-tasks", type=int, default=1000, help="N for RQ")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated variants")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        child(a.child, a.tasks)
        return
    from tests.support.pg_database import PostgresCluster

    variants = {
        "tidings": a.tasks,
        "db-sqlite": a.peer_tasks,
        "db-postgres": a.peer_tasks,
        "rq": a.rq_tasks,
        "rq-simple": a.rq_tasks,
    }
    if a.only:
        variants = {k: v for k, v in variants.items() if k in a.only.split(",")}
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    pg = PostgresCluster().start()
    tmp = Path(tempfile.mkdtemp(prefix="tidings-peers-"))
    try:
        with bench_redis() as server:
            for r in range(a.rounds):
                for variant, n in variants.items():
                    db = str(tmp / f"{variant}-{r}.sqlite3")
                    if variant == "db-postgres":
                        db = _pg_database(pg.url, f"peers_{r}")
                    rows[variant].append(measure(variant, n, server.url, db))
                    print(f"  round {r + 1} {variant}: {rows[variant][-1]}", flush=True)
    finally:
        pg.stop()
    _report(rows, a.rounds)


def _pg_database(admin_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


def _report(rows: dict[str, list[dict[str, Any]]], rounds: int) -> None:
    med = {
        k: {f: statistics.median(r[f] for r in v) for f in ("enqueue", "drain")}
        for k, v in rows.items()
        if v
    }
    print(f"\nmedians of {rounds} round(s); N per row; drain = N / (last finished_at - "
          "first started_at)")  # fmt: skip
    print(f"{'backend':<12} {'N':>6} {'enqueue/s':>10} {'drain/s':>10}  result ok")
    for k, v in rows.items():
        print(
            f"{k:<12} {v[0]['n']:>6} {med[k]['enqueue']:>10.0f} {med[k]['drain']:>10.0f}  "
            f"{all(r['ok'] for r in v)}"
        )
    if "tidings" in med:
        peers = {k: m for k, m in med.items() if k != "tidings"}
        if peers:
            best_enq = max(peers, key=lambda k: peers[k]["enqueue"])
            best_drain = max(peers, key=lambda k: peers[k]["drain"])
            t = med["tidings"]
            print(
                f"tidings / best peer: enqueue {t['enqueue'] / peers[best_enq]['enqueue']:.2f}x "
                f"({best_enq}; goal >= 1), drain {t['drain'] / peers[best_drain]['drain']:.2f}x "
                f"({best_drain}; goal >= 3)"
            )


if __name__ == "__main__":
    main()
