"""A queued notification's worker steps beside a bare job's, in instructions (valgrind).

Issue 28, goal 4. ``notify_stages.py`` times the steps in wall clock; ``instructions.py``
counts a whole drain, whose count still moves by a few per cent between identical runs
(under valgrind the pops' fill and the once-a-second timers depend on the timing). This
counts each step alone, with no Redis, no timers and no other task, in a child process
run under ``valgrind --tool=cachegrind`` with ``PYTHONHASHSEED=0``: the step is run K
times and 0 times and the difference divided by K, so the count is the step's own and
the same from one run to the next (to about +-1,000)::

    .venv/bin/python -m benchmarks.notify_stages_ir --base /tmp/base/src

Steps: ``open_envelope`` (signature check, JSON parse, field checks),
``serializer.decode``, ``job.middleware()``, ``await job.handle()`` and the whole
``Executor.run`` (all of these plus the run's bookkeeping, its events and the
pipeline), on the envelopes ``notify_overhead_app.fill`` queues. ``--base DIR`` counts
another tree's ``src`` beside this one's. Valgrind runs OpenSSL's SHA-256 without the
CPU's SHA extensions, so a signature's share (more bytes to hash in a notification's
bigger envelope) is larger here than on a CPU that has them.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import redis

from benchmarks._redis import bench_redis
from benchmarks.instructions import counted

HERE = Path(__file__).resolve().parent.parent
KINDS = ("bare", "notification")
STAGES = ("open_envelope", "serializer.decode", "job.middleware()", "await job.handle()",
          "Executor.run")  # fmt: skip
CHILD = """
import asyncio, json, os, sys, time
from benchmarks import notify_overhead_app as bench
from tidings.moves.consume import Reserved
from tidings.wire import serializer
from tidings.wire.envelope import open_envelope
from tidings.worker.execute import Executor
from tidings.worker.options import WorkerOptions
from tidings.worker.threads import SyncRunner

app = bench.app
kind, stage, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
jid, text = json.load(open(os.environ["BENCH_ENVELOPES"]))[kind]
env = text.encode()
body = open_envelope(env, app.signer, job_id=jid)
job = serializer.decode(body["data"], app.resolve_class)
ex = Executor(app, WorkerOptions(), SyncRunner(1), prefix=app.settings.prefix,
              stop=lambda reason, code: None, alone=lambda: True)

async def run() -> None:
    out = await ex.run(Reserved(jid, "default", 1, 0, env), time.time())
    assert type(out).__name__ == "Done", out

async def handle() -> None:
    await job.handle()

steps = {
    "open_envelope": lambda: open_envelope(env, app.signer, job_id=jid),
    "serializer.decode": lambda: serializer.decode(body["data"], app.resolve_class),
    "job.middleware()": job.middleware,
}
coros = {"await job.handle()": handle, "Executor.run": run}

async def main() -> None:
    if stage in coros:
        step = coros[stage]
        for _ in range(5):
            await step()
        for _ in range(k):
            await step()
    else:
        call = steps[stage]
        for _ in range(5):
            call()
        for _ in range(k):
            call()

asyncio.run(main())
"""


def instructions(src: str, envelopes: str, kind: str, stage: str, k: int) -> int:
    """Instructions of one child under cachegrind: ``stage`` run ``k`` times."""
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{HERE}", PYTHONHASHSEED="0",
               BENCH_ENVELOPES=envelopes)  # fmt: skip
    return counted(["-c", CHILD, kind, stage, str(k)], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=3000, help="calls of a step in a child")
    parser.add_argument("--base", help="another tree's src directory, counted beside")
    parser.add_argument("--stage", action="append", choices=STAGES, help="default: all")
    args = parser.parse_args()
    trees = {"this tree": str(HERE / "src")}
    if args.base:
        trees = {"base": str(Path(args.base).resolve()), **trees}
    with bench_redis() as server, tempfile.TemporaryDirectory() as tmp:
        os.environ["TIDINGS_REDIS_URL"] = server.url
        os.environ.setdefault("TIDINGS_KEY", "notify-overhead-benchmark-key-0123456789abcdef")
        from benchmarks import notify_overhead_app as bench

        app = bench.app
        jobs_key = f"{app.settings.prefix}:queue:{{default}}:jobs"
        client = redis.Redis.from_url(server.url)
        for kind in KINDS:
            bench.fill(kind, 1)
        found: dict[str, list[str]] = {}
        for jid, env in client.hgetall(jobs_key).items():
            found["notification" if b"Hello" in env else "bare"] = [jid.decode(), env.decode()]
        envelopes = str(Path(tmp) / "envelopes.json")
        Path(envelopes).write_text(json.dumps(found))

        print(f"valgrind (cachegrind), instructions per call ({args.k:,} calls less 0)")
        head = "".join(f"{f'{tree}: {kind}':>26}" for tree in trees for kind in KINDS)
        print(f"  {'per call':<20}{head}   extra: notification - bare, per tree")
        for stage in args.stage or STAGES:
            counts: dict[tuple[str, str], float] = {}
            for tree, src in trees.items():
                for kind in KINDS:
                    big = instructions(src, envelopes, kind, stage, args.k)
                    small = instructions(src, envelopes, kind, stage, 0)
                    counts[tree, kind] = (big - small) / args.k
            cells = "".join(f"{counts[t, kind]:26,.0f}" for t in trees for kind in KINDS)
            extra = " ".join(f"{counts[t, 'notification'] - counts[t, 'bare']:,.0f}" for t in trees)
            print(f"  {stage:<20}{cells}   {extra}", flush=True)
            if stage == "Executor.run":
                ratios = ", ".join(
                    f"{t} {counts[t, 'bare'] / counts[t, 'notification']:.3f}" for t in trees
                )
                print(f"  Executor.run, bare / notification: {ratios}")


if __name__ == "__main__":
    main()
