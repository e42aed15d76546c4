"""Broadcast: dispatch-to-browser latency to many SSE clients over two web processes.

::

    .venv/bin/python -m benchmarks.broadcast                     # 1,000 clients, 1,000 msg/s
    .venv/bin/python -m benchmarks.broadcast --clients 200 --rate 200 --seconds 5

Starts a throwaway Redis, two ``notify-worker broadcast-server`` processes (the web
processes), and a client process (asyncio, raw sockets, HTTP/1.0 so the body is the SSE
text) holding ``--clients`` connections, half on each web process, client i subscribed to
channel ``u.i``. Message k goes to channel ``u.(k % clients)`` carrying its send time;
the client process records arrival time per message id (k) and checks every expected k
arrived exactly once.

Rounds, interleaved (A B A B): **baseline** at a tenth of the rate, **publish** at the
rate (``app.broadcasting.publish``: one XADD, no queue), and one **dispatch** round at the
rate through the whole pipeline (``app.dispatch(Ping(...))`` -> queue -> a worker's
``BroadcastEvent`` -> XADD -> web process -> client). Memory per client: the web
processes' RSS with every client connected minus before, over the clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
KEY = "broadcast-bench-key-0123456789abcdef"


# -- the client process --------------------------------------------------------------------


async def _client(i: int, port: int, got: list[list[Any]], ready: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.write(f"GET /?channel=u.{i} HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                 "Accept: text/event-stream\r\n\r\n".encode())  # fmt: skip
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"client {i}: {head[:80]!r}")
    buf = b""
    opened = False
    loads = json.loads
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            return
        now = time.time()
        buf += chunk
        *blocks, buf = buf.split(b"\n\n")
        for block in blocks:
            if not opened and b"\nid: " in b"\n" + block:
                opened = True
                ready[0] += 1
            pos = block.find(b"data: ")
            if pos >= 0:
                d = loads(block[pos + 6 :])["data"]
                got[i].append((d["k"], now - d["t"]))


async def _clients_main(ports: list[int], n: int) -> None:
    got: list[list[Any]] = [[] for _ in range(n)]
    ready = [0]
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(_client(i, ports[i % len(ports)], got, ready)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)  # do not flood the accept queues
    deadline = time.time() + 120
    while ready[0] < n and time.time() < deadline:
        await asyncio.sleep(0.1)
    print(json.dumps({"ready": ready[0]}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        cmd = line.strip()
        if cmd in ("", "quit"):
            break
        if cmd.startswith("collect"):
            out = [[(k, lat) for k, lat in g] for g in got]
            for g in got:
                g.clear()
            print(json.dumps({"got": out}), flush=True)
    for t in tasks:
        t.cancel()


# -- the driver ------------------------------------------------------------------------------


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _wait_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    import httpx

    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"web process on {port} exited")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/tidings-broadcast.js", timeout=1).is_success:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"web process on {port} did not answer")


def _send(app: Any, n_clients: int, rate: float, seconds: float, start_k: int,
          via_queue: bool) -> int:  # fmt: skip
    """Send rate*seconds messages paced evenly; returns how many were sent."""
    from benchmarks.broadcast_app import Ping

    total = int(rate * seconds)
    t0 = time.perf_counter()
    for j in range(total):
        due = t0 + j / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        k = start_k + j
        channel = f"u.{k % n_clients}"
        if via_queue:
            app.dispatch(Ping(k, time.time(), channel))
        else:
            app.broadcasting.publish(channel, "ping", {"k": k, "t": time.time()},
                                     message_id=str(k))  # fmt: skip
    return total


def _collect(clients: subprocess.Popen[str]) -> list[list[Any]]:
    assert clients.stdin is not None and clients.stdout is not None
    clients.stdin.write("collect\n")
    clients.stdin.flush()
    return list(json.loads(clients.stdout.readline())["got"])


def _check(got: list[list[Any]], n_clients: int, start_k: int, total: int) -> dict[str, Any]:
    lat: list[float] = []
    lost = dup = stray = 0
    for i, items in enumerate(got):
        ks = [k for k, _ in items]
        expected = set(range(start_k + (i - start_k) % n_clients, start_k + total, n_clients))
        seen = set(ks)
        dup += len(ks) - len(seen)
        stray += len(seen - expected)
        lost += len(expected - seen)
        lat += [x for _, x in items]
    return {"p50_ms": _pct(lat, 0.5) * 1000, "p99_ms": _pct(lat, 0.99) * 1000,
            "max_ms": max(lat) * 1000 if lat else float("nan"), "received": len(lat),
            "lost": lost, "duplicated": dup, "other_channel": stray}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="per round")
    parser.add_argument("--rounds", type=int, default=2, help="A/B pairs")
    parser.add_argument("--worker-processes", type=int, default=1,
                        help="notify-worker --processes for the dispatch round")  # fmt: skip
    parser.add_argument("--role", default="driver", help=argparse.SUPPRESS)
    parser.add_argument("--ports", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "clients":
        asyncio.run(_clients_main([int(p) for p in args.ports.split(",")], args.clients))
        return

    sys.path.insert(0, str(ROOT))
    from benchmarks._redis import _free_port, bench_redis
    from tidings import App

    with bench_redis() as server:
        prefix = f"tbench{os.getpid()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")}
        env.update(PYTHONPATH=str(ROOT), TIDINGS_REDIS_URL=server.url, TIDINGS_KEY=KEY,
                   TIDINGS_PREFIX=prefix, TIDINGS_ALLOWED_MODULES="benchmarks")  # fmt: skip
        ports = [_free_port(), _free_port()]
        procs: list[subprocess.Popen[Any]] = []
        try:
            webs = [subprocess.Popen([NOTIFY_WORKER, "broadcast-server", "-A",
                                      "benchmarks.broadcast_app:app", "--port", str(p)],
                                     env=env, cwd=ROOT) for p in ports]  # fmt: skip
            procs += webs
            for p, w in zip(ports, webs, strict=True):
                _wait_up(p, w)
            rss0 = [_rss_kb(w.pid) for w in webs]
            clients = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.broadcast", "--role", "clients",
                 "--clients", str(args.clients), "--ports", ",".join(map(str, ports))],
                env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            procs.append(clients)
            assert clients.stdout is not None
            ready = json.loads(clients.stdout.readline())["ready"]
            time.sleep(1.0)
            rss1 = [_rss_kb(w.pid) for w in webs]
            per_client_kb = (sum(rss1) - sum(rss0)) / max(1, ready)
            print(f"clients connected: {ready}/{args.clients} over 2 web processes; "
                  f"web RSS {sum(rss0) / 1024:.1f} MB -> {sum(rss1) / 1024:.1f} MB: "
                  f"{per_client_kb:.1f} KB per connected client")  # fmt: skip
            app = App(env=False, redis_url=server.url, key=KEY, prefix=prefix,
                      allowed_modules="benchmarks")  # fmt: skip
            app.broadcasting.max_len = 10_000
            redis_pid = int(app.queue_for(None).client.info("server")["process_id"])
            watched = [webs[0].pid, webs[1].pid, redis_pid, clients.pid]
            k = 0
            results: dict[str, list[dict[str, Any]]] = {"baseline": [], "publish": []}
            for _ in range(args.rounds):
                for name, rate in (("baseline", args.rate / 10), ("publish", args.rate)):
                    cpu0 = [_cpu_s(p) for p in watched]
                    sent = _send(app, args.clients, rate, args.seconds, k, via_queue=False)
                    time.sleep(2.0)
                    cpu1 = [_cpu_s(p) for p in watched]
                    res = _check(_collect(clients), args.clients, k, sent)
                    res["sent"] = sent
                    used = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
                    res["cpu_s"] = {"web": round(used[0] + used[1], 2), "redis": round(used[2], 2),
                                    "clients": round(used[3], 2)}  # fmt: skip
                    results[name].append(res)
                    print(f"  {name:<9} {rate:>7.0f} msg/s  {res}", flush=True)
                    k += sent
            many = ["--processes", str(args.worker_processes)] if args.worker_processes > 1 else []
            worker = subprocess.Popen([NOTIFY_WORKER, "-A", "benchmarks.broadcast_app:app",
                                       "--concurrency", "64", "--sleep", "0.2", *many],
                                      env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)  # fmt: skip
            procs.append(worker)
            time.sleep(3.0)
            t_send = time.perf_counter()
            sent = _send(app, args.clients, args.rate, args.seconds, k, via_queue=True)
            sent_s = time.perf_counter() - t_send
            # the worker may lag: wait until the queue is drained (at most two minutes)
            rq = app.queue_for(None)
            deadline = time.time() + 120
            while time.time() < deadline:
                s = rq.sizes(["default"])["default"]
                if s["ready"] + s["reserved"] + s["delayed"] == 0:
                    break
                time.sleep(0.2)
            drained_s = time.perf_counter() - t_send
            time.sleep(2.0)
            dres = _check(_collect(clients), args.clients, k, sent)
            dres["sent"] = sent
            dres["dispatched_per_s"] = round(sent / sent_s)
            dres["drained_per_s"] = round(sent / drained_s)
            print(f"  dispatch  {args.rate:>7.0f} msg/s  {dres}", flush=True)
            print()
            print(
                f"| {args.clients} SSE clients, 2 web processes | rate | p50 ms | p99 ms "
                "(spread) | max ms | lost | duplicated | other channel |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for name, rate in (("baseline (publish)", args.rate / 10),
                               ("publish (XADD)", args.rate)):  # fmt: skip
                rs = results[name.split()[0]]
                p50 = statistics.median(r["p50_ms"] for r in rs)
                p99s = [r["p99_ms"] for r in rs]
                print(f"| {name} | {rate:.0f}/s | {p50:.1f} | {statistics.median(p99s):.1f} "
                      f"({min(p99s):.1f}-{max(p99s):.1f}) | {max(r['max_ms'] for r in rs):.1f} | "
                      f"{sum(r['lost'] for r in rs)} | {sum(r['duplicated'] for r in rs)} | "
                      f"{sum(r['other_channel'] for r in rs)} |")  # fmt: skip
            print(f"| dispatch (queue + worker) | {args.rate:.0f}/s | {dres['p50_ms']:.1f} | "
                  f"{dres['p99_ms']:.1f} | {dres['max_ms']:.1f} | {dres['lost']} | "
                  f"{dres['duplicated']} | {dres['other_channel']} |")  # fmt: skip
            print(f"memory: {per_client_kb:.1f} KB per connected client (web processes' RSS)")
            if clients.stdin is not None:
                clients.stdin.write("quit\n")
                clients.stdin.flush()
            app.close()
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
