"""Non-Python anchors for the peers section: Sidekiq (Ruby) and BullMQ (Node).

Both optional, each skipped with a note when absent:

* **Sidekiq**: Debian's ``ruby-sidekiq`` (``/usr/bin/sidekiq``; apt-get install
  ruby-sidekiq). The worker loads ``benchmarks/anchors/sidekiq_app.rb``. Jobs are pushed
  from Python in Sidekiq's own wire format (the JSON hash ``Sidekiq::Client`` writes,
  ``LPUSH queue:default`` + ``SADD queues``), so no Ruby producer is timed; the drain
  counts ``LLEN queue:default`` (a job leaves it when a processor takes it: at most
  ``-c`` jobs are still running when it reaches 0).
* **BullMQ**: ``bullmq`` from npm, installed by ``make bench-anchors`` (``npm install``
  in ``benchmarks/anchors/``; node_modules is not committed). Jobs are pushed by its
  own client (``node bullmq_worker.mjs push N``: ``Queue.addBulk``; ``stamp R S``:
  ``Queue.add`` at R/s), the drain counts ``LLEN bull:<q>:wait`` + ``LLEN ...:active``.

Each is measured with its defaults (Sidekiq 6's ``-c 10``; BullMQ's ``concurrency: 1``)
and a larger setting (Sidekiq ``-c 25``; BullMQ ``concurrency: 100``). Their enqueue is
not measured (the rows say so): the Python side pushes for them. Their stamp jobs append
``now - sent_at`` to the same latency key as the Python peers'.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.bench_queue import ROOT, Ctx, _app, worker_env

if TYPE_CHECKING:
    from benchmarks.peers import Peer

ANCHORS = ROOT / "benchmarks" / "anchors"
SIDEKIQ_QUEUE = "queue:default"
BULLMQ_QUEUE = "bench"


def _sidekiq_job(klass: str, args: list[Any]) -> bytes:
    now = time.time()
    return json.dumps(
        {
            "retry": True,
            "queue": "default",
            "class": klass,
            "args": args,
            "jid": os.urandom(12).hex(),
            "created_at": now,
            "enqueued_at": now,
        }
    ).encode()


def _sidekiq(ctx: Ctx, concurrency: int, *, default: bool) -> Peer:
    from benchmarks.peers import Peer

    def fill(n: int) -> None:
        pipe = ctx.client.pipeline(transaction=False)
        for i in range(n):
            pipe.lpush(SIDEKIQ_QUEUE, _sidekiq_job("NoopJob", [i]))
            if i % 1000 == 999:
                pipe.execute()
        pipe.sadd("queues", "default")
        pipe.execute()

    def stamp(sent_at: float) -> None:
        pipe = ctx.client.pipeline(transaction=False)  # as Sidekiq::Client: SADD + LPUSH
        pipe.sadd("queues", "default")
        pipe.lpush(SIDEKIQ_QUEUE, _sidekiq_job("StampJob", [sent_at]))
        pipe.execute()

    sidekiq = shutil.which("sidekiq") or "/usr/bin/sidekiq"
    return Peer(
        f"Sidekiq -c {concurrency}",
        lambda i: None,
        [sidekiq, "-r", str(ANCHORS / "sidekiq_app.rb"), "-c", str(concurrency)],
        lambda: int(ctx.client.llen(SIDEKIQ_QUEUE)),
        f"sidekiq -c {concurrency}" + (" (its default)" if default else "") + ", Ruby, 1 process",
        stamp=stamp if default else None,
        env={"BENCH_LATENCY_KEY": _app().mark_key("latency")},
        idle_wait="BRPOP, timeout 2 s, one per processor thread",
        anchor=True,
        drain_only=not default,
        fill=fill,
        stop_grace_s=10.0,
    )


def _bullmq(ctx: Ctx, concurrency: int, *, default: bool) -> Peer:
    from benchmarks.peers import Peer

    node = shutil.which("node") or "node"
    script = str(ANCHORS / "bullmq_worker.mjs")

    def env() -> dict[str, str]:
        return worker_env(
            ctx,
            BULLMQ_QUEUE=BULLMQ_QUEUE,
            BENCH_LATENCY_KEY=_app().mark_key("latency"),
            BULLMQ_CONCURRENCY=str(concurrency),
        )

    def fill(n: int) -> None:
        subprocess.run([node, script, "push", str(n)], cwd=ANCHORS, env=env(), check=True)

    def paced(per_s: float, duration_s: float) -> int:
        subprocess.run(
            [node, script, "stamp", str(per_s), str(duration_s)], cwd=ANCHORS, env=env(), check=True
        )
        return int(per_s * duration_s)

    def pending() -> int:
        return int(ctx.client.llen(f"bull:{BULLMQ_QUEUE}:wait")) + int(
            ctx.client.llen(f"bull:{BULLMQ_QUEUE}:active")
        )

    return Peer(
        f"BullMQ concurrency {concurrency}",
        lambda i: None,
        [node, script],
        pending,
        f"BullMQ Worker, concurrency {concurrency}"
        + (" (its default)" if default else "")
        + ", Node, 1 process",
        env={
            "BULLMQ_QUEUE": BULLMQ_QUEUE,
            "BULLMQ_CONCURRENCY": str(concurrency),
            "BENCH_LATENCY_KEY": _app().mark_key("latency"),
        },
        idle_wait="BRPOPLPUSH/BZPOPMIN marker, blocking",
        anchor=True,
        drain_only=not default,
        fill=fill,
        paced=paced if default else None,
        stop_grace_s=10.0,
    )


def anchors(ctx: Ctx, missing: list[str]) -> list[Peer]:
    """The anchors installed here; the absent ones are added to ``missing`` with how to
    install them."""
    out: list[Peer] = []
    if shutil.which("sidekiq") or Path("/usr/bin/sidekiq").exists():
        out += [_sidekiq(ctx, 10, default=True), _sidekiq(ctx, 25, default=False)]
    else:
        missing.append("Sidekiq (apt-get install ruby-sidekiq)")
    if shutil.which("node") and (ANCHORS / "node_modules" / "bullmq").is_dir():
        out += [_bullmq(ctx, 1, default=True), _bullmq(ctx, 100, default=False)]
    else:
        missing.append("BullMQ (node 18+; make bench-anchors: npm install in benchmarks/anchors)")
    return out


def anchor_versions() -> str:
    """The anchors' versions, as ", Sidekiq x (ruby y), BullMQ z (node w)"."""
    out = ""
    try:
        code = 'require "sidekiq"; print Sidekiq::VERSION, " (ruby ", RUBY_VERSION, ")"'
        ver = subprocess.run(
            ["ruby", "-e", code],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if ver.returncode == 0:
            out += f", Sidekiq {ver.stdout}"
    except (OSError, subprocess.TimeoutExpired):
        pass
    pkg = ANCHORS / "node_modules" / "bullmq" / "package.json"
    if pkg.exists():
        node = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30)
        out += f", BullMQ {json.loads(pkg.read_text())['version']} (node {node.stdout.strip()})"
    return out
