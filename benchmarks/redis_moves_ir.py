"""Redis instructions per job of the pop and ack scripts alone, under callgrind (issue 28).

    python -m benchmarks.redis_moves_ir [--n 1600] [--batch 16] [--before REF] [--rounds 1]

CPU time on a shared machine moves with the load; the number of instructions Redis runs
does not. This pushes N no-op jobs, then pops and acks them in batches of ``--batch``
(as a worker with ``--concurrency`` of that size does: one pop script, one ack script;
the next batch is popped before the last one is acked)
against a ``redis-server`` run under ``valgrind --tool=callgrind``, with instrumentation
switched on only around the pop/ack loop, and prints Redis instructions (Ir) per job:
the whole server, and the script calls alone (``evalGenericCommand``, inclusive).
``--before REF`` runs the same loop with another tree's ``src`` (a git ref of this
repository, or a directory holding ``tidings/``) beside this tree's, in turns.

Without valgrind, the same loop runs against a plain redis-server and prints
``INFO commandstats`` (EVALSHA usec per job) and ``INFO cpu`` per job instead.
Under callgrind Redis runs ~50x slower, so its 10 Hz cron weighs ~10x more per job than
in a real drain: compare the ``scripts`` column between trees, not the total with a drain.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _loop(src: str, url: str, n: int, batch: int, hook: str) -> None:
    """The pop/ack loop, run in a subprocess whose ``tidings`` comes from ``src``."""
    sys.path[:0] = [src, str(ROOT)]
    os.environ.update(TIDINGS_REDIS_URL=url, TIDINGS_KEY=secrets.token_urlsafe(32),
                      TIDINGS_PREFIX=f"ir{os.getpid()}")  # fmt: skip
    import redis

    import tidings
    from benchmarks import bench_app as b
    from tidings.moves.consume import Broker
    from tidings.moves.queues import DONE_KEEP_MS, DONE_MAX
    from tidings.redis import scripts

    assert tidings.__file__ and tidings.__file__.startswith(src), tidings.__file__
    client = redis.Redis.from_url(url)
    k = b.app.queue_for(None).keys("default")
    b.app.dispatch_many([b.NoOpJob(i) for i in range(n)])
    broker = Broker(None, retry_after_s=60, max_bytes=1 << 20)  # type: ignore[arg-type]
    ack_keys = [k.reserved, k.jobs, k.attempts, k.done, k.receipt("ack:bench")]
    # Each script once before the counted loop, so that loading it (EVAL) is not counted.
    keys, args = broker.pop_command(k, 0)
    scripts.POP.call(client, keys, args)
    scripts.ACK.call(client, ack_keys, [DONE_KEEP_MS, DONE_MAX, 0, 0])
    client.config_resetstat()
    cpu0 = sum(float(client.info("cpu")[f]) for f in ("used_cpu_user", "used_cpu_sys"))
    if hook:
        subprocess.run([*hook.split(), "on"], check=True, capture_output=True)
    # As in a worker draining no-op jobs: the next batch is popped while the last one
    # waits for its ack, so two batches are reserved when an ack runs.
    seq = done = 0
    waiting: list[tuple[str, int]] = []
    while True:
        keys, args = broker.pop_command(k, batch)
        res = broker.read_pop(k, scripts.POP.call(client, keys, args))
        if waiting:
            seq += 1
            acks: list[scripts.Arg] = [DONE_KEEP_MS, DONE_MAX, seq, len(waiting)]
            for job_id, token in waiting:
                acks += (job_id, token)
            assert not scripts.ACK.call(client, ack_keys, acks)
            done += len(waiting)
        waiting = [(job.id, job.token) for job in res.jobs]
        if not waiting:
            break
    if hook:
        subprocess.run([*hook.split(), "off"], check=True, capture_output=True)
    cpu = sum(float(client.info("cpu")[f]) for f in ("used_cpu_user", "used_cpu_sys")) - cpu0
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    assert done == n, (done, n)
    print(f"RESULT cpu_us={cpu / n * 1e6:.2f} evalsha_us={int(stats.get('usec', 0)) / n:.2f} "
          f"calls={int(stats.get('calls', 0)) / n:.4f}")  # fmt: skip
    client.flushdb()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ir(out: Path, functions: tuple[str, ...]) -> dict[str, int]:
    """Program total and the inclusive Ir of ``functions`` from a callgrind dump."""
    dump = max(out.glob("cg.*.out.*"), key=lambda p: p.stat().st_size)
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(dump)],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    found: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[0].replace(",", "").isdigit():
            continue
        value = int(parts[0].replace(",", ""))
        if "PROGRAM" in line:
            found["total"] = value
        for f in functions:
            if f"{f} " in line or line.rstrip().endswith(f):
                found.setdefault(f, value)
    return found


def _one(src: str, n: int, batch: int, callgrind: bool) -> dict[str, float]:
    port = _free_port()
    work = Path(tempfile.mkdtemp(prefix="tidings-ir-"))
    server = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
              "--dir", str(work)]  # fmt: skip
    if callgrind:
        server = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                  f"--callgrind-out-file={work}/cg.%p.out", *server]  # fmt: skip
    proc = subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        deadline = time.monotonic() + 60
        while True:
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.2)
        hook = f"{sys.executable} {__file__} --_hook {proc.pid}" if callgrind else ""
        out = subprocess.run(
            [sys.executable, __file__, "--_loop", src, f"redis://127.0.0.1:{port}/0",
             str(n), str(batch), hook],
            capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout  # fmt: skip
        line = next(x for x in out.splitlines() if x.startswith("RESULT"))
        result = {kv.split("=")[0]: float(kv.split("=")[1]) for kv in line.split()[1:]}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if callgrind:
        ir = _ir(work, ("evalGenericCommand", "serverCron"))
        result.update(
            ir_total=ir.get("total", 0) / n,
            ir_scripts=ir.get("evalGenericCommand", 0) / n,
            ir_cron=ir.get("serverCron", 0) / n,
        )
    shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_loop":
        _loop(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--_hook":
        pid, what = sys.argv[2], sys.argv[3]
        if what == "on":
            subprocess.run(["callgrind_control", "-i", "on", pid], check=True)
        else:
            subprocess.run(["callgrind_control", "-d", pid], check=True)
            subprocess.run(["callgrind_control", "-i", "off", pid], check=True)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--before", help="a git ref (or src directory) to run beside this tree")
    ap.add_argument("--no-callgrind", action="store_true", help="CPU figures, not Ir")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.redis_cpu import _before_src

    callgrind = not args.no_callgrind and shutil.which("valgrind") is not None
    trees = [("this tree", str(ROOT / "src"))]
    if args.before:
        src, label = _before_src(args.before)
        trees.append((f"before ({label})", src))
    rows: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for _ in range(args.rounds):
        for name, src in trees:
            rows[name].append(_one(src, args.n, args.batch, callgrind))
    how = "Redis under callgrind: instructions" if callgrind else "INFO cpu / commandstats"
    print(f"pop + ack scripts alone, N = {args.n:,} no-op jobs in batches of {args.batch}, "
          f"{args.rounds} round(s); {how} per job")  # fmt: skip
    for name, results in rows.items():
        last = results[-1]
        if callgrind:
            print(f"  {name:<24} scripts {last['ir_scripts']:9,.0f} Ir/job   whole server "
                  f"{last['ir_total']:9,.0f} Ir/job (of which cron {last['ir_cron']:,.0f}, "
                  "inflated by valgrind's slowness)")  # fmt: skip
        else:
            cpu = sorted(r["cpu_us"] for r in results)
            ev = sorted(r["evalsha_us"] for r in results)
            print(f"  {name:<24} Redis CPU {cpu[len(cpu) // 2]:6.1f} us/job [{cpu[0]:.1f}-"
                  f"{cpu[-1]:.1f}]   EVALSHA {ev[len(ev) // 2]:6.1f} us/job [{ev[0]:.1f}-"
                  f"{ev[-1]:.1f}]   script calls/job {last['calls']:.3f}")  # fmt: skip
    if len(trees) > 1 and callgrind:
        a, b = rows[trees[0][0]][-1], rows[trees[1][0]][-1]
        print(f"  this tree / before: scripts {a['ir_scripts'] / b['ir_scripts']:.2f}x")


if __name__ == "__main__":
    main()
