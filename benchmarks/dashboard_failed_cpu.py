"""CPU per request of the dashboard's failed-jobs page, with 10,000 and 100,000 failed jobs.

    python benchmarks/dashboard_failed_cpu.py [--sizes 10000,100000] [--requests 5]

The failed store is filled in its real layout (zset by failure time, info and body
hashes; a realistic traceback per record), then the dashboard (in this process, through
httpx's ASGI transport) is asked for the first page, a class search, a text search that
matches one record in a thousand, and a text search that matches nothing (the worst
case: it reads as far as a request may). The figure is the CPU time this process used
(user + system, ``time.process_time``) per request; Redis's own CPU (from
``INFO cpu``) is printed beside it. Wall clock is printed but not the figure to compare:
on a shared machine it swings.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import os
import re
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._redis import bench_redis, delete_prefix  # noqa: E402

TRACE = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/.venv/lib/python3.11/site-packages/tidings/worker/execute.py", line 212,'
    " in _run_job\n    result = await run(job)\n"
    '  File "/srv/app/billing/jobs.py", line 88, in handle\n'
    "    invoice = await self.client.fetch_invoice(self.invoice_id, timeout=self.timeout)\n"
    '  File "/srv/app/billing/client.py", line 41, in fetch_invoice\n'
    "    raise UpstreamError(f'upstream answered {status} for {invoice_id}')\n"
    "billing.client.UpstreamError: upstream answered 503 for invoice {n}\n"
)
SEARCH = "/failed?q=invoice+1234"
CLASSES = ("billing.jobs.SendInvoice", "mail.jobs.Welcome", "sync.jobs.PushCrm")


def trace(size: int) -> str:
    """A traceback of about ``size`` characters (frames repeated), ending as TRACE does."""
    head, _, tail = TRACE.partition('  File "/srv/app/billing/jobs.py')
    frame = (
        '  File "/srv/app/.venv/lib/python3.11/site-packages/framework/middleware.py", '
        "line 120, in __call__\n    return await self.app(scope, receive, send)\n"
    )
    frames = frame * max(0, (size - len(TRACE)) // len(frame))
    return head + frames + '  File "/srv/app/billing/jobs.py' + tail


def fill(client: Any, prefix: str, queue: str, n: int, size: int) -> None:
    """``n`` failed records in ``queue``'s failed store, one millisecond apart."""
    import orjson

    from tidings.redis.keys import QueueKeys

    k = QueueKeys.build(prefix, queue)
    failed, info, body = k.failed, k.failed_info, k.failed_body
    text = trace(size)
    t0 = int(time.time() * 1000) - n
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        job_id = secrets.token_hex(16)
        pipe.zadd(failed, {job_id: t0 + i})
        pipe.hset(info, job_id, orjson.dumps({
            "name": CLASSES[i % 3], "queue": queue, "attempts": 3,
            "exception": text.replace("{n}", str(i)),
        }))  # fmt: skip
        pipe.hset(body, job_id, b'{"sig":"00","body":{"uuid":"%s","data":{}}}' % job_id.encode())
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()


def redis_cpu(client: Any) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def measure(app: Any, client: Any, paths: dict[str, str], requests: int) -> dict[str, tuple]:
    import httpx

    from tidings.dashboard import Auth, create_app

    web = create_app(app, auth=Auth())
    out: dict[str, tuple] = {}

    async def main() -> None:
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            (await c.get("/failed")).raise_for_status()  # warm up (templates, scripts)
            for label, path in paths.items():
                cpu, wall, rcpu = [], [], []
                for _ in range(requests):
                    r0, c0, w0 = redis_cpu(client), time.process_time(), time.perf_counter()
                    resp = await c.get(path)
                    cpu.append(time.process_time() - c0)
                    wall.append(time.perf_counter() - w0)
                    rcpu.append(redis_cpu(client) - r0)
                    assert resp.status_code == 200, (path, resp.status_code)
                rows = resp.text.count("<tr data-id=")
                out[label] = (statistics.median(cpu), statistics.median(rcpu),
                              statistics.median(wall), rows)  # fmt: skip
            # Reach: follow "Search older" until the oldest record (pages with a cursor).
            c0, r0, pages, rows, path = time.process_time(), redis_cpu(client), 0, 0, SEARCH
            while path:
                resp = await c.get(path)
                assert resp.status_code == 200, (path, resp.status_code)
                pages += 1
                rows += resp.text.count("<tr data-id=")
                found = re.search(r'id="older" href="([^"]+)"', resp.text)
                path = html.unescape(found.group(1)) if found else ""
            out[f"search to the oldest ({pages} req)"] = (
                (time.process_time() - c0) / pages,
                (redis_cpu(client) - r0) / pages,
                0.0,
                rows,
            )

    asyncio.run(main())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument(
        "--trace-bytes",
        type=int,
        default=8000,
        help="size of each record's traceback (the worker keeps up to 8 KiB)",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with bench_redis() as server:
        prefix = f"tdash{os.getpid()}"
        from tidings import App

        # Transports with credentials, as in production: each registered secret is one
        # more form the redaction of every shown text looks for.
        app = App(env=False, redis_url=server.url, key=secrets.token_urlsafe(32), prefix=prefix,
                  mail_url=f"smtp://mailer:{secrets.token_urlsafe(18)}@127.0.0.1:2525",
                  sms_url=f"twilio://AC{secrets.token_hex(16)}:{secrets.token_hex(16)}@default"
                          "?from=%2B15550001111",
                  webhook_secret="whsec_" + secrets.token_urlsafe(24))  # fmt: skip
        client = app.queue_for(None).client
        paths = {
            "first page": "/failed",
            "class search": "/failed?class=Welcome",
            "text search, rare match": SEARCH,
            "text search, no match": "/failed?q=no-such-text",
        }
        print(
            f"redis {server.version}; tracebacks of {args.trace_bytes:,} characters; "
            f"CPU per request (median of {args.requests})"
        )
        print(f"{'failed jobs':>12}  {'request':<26} {'CPU ms':>8} {'redis CPU ms':>13} "
              f"{'wall ms':>8} {'rows':>5}")  # fmt: skip
        try:
            for n in sizes:
                delete_prefix(client, prefix)
                fill(client, prefix, "default", n - 1, args.trace_bytes)
                fill(client, prefix, "other", 1, args.trace_bytes)
                for label, (cpu, rcpu, wall, rows) in measure(app, client, paths,
                                                              args.requests).items():  # fmt: skip
                    shown = f"{wall * 1000:>8.1f}" if wall else f"{'-':>8}"
                    print(f"{n:>12,}  {label:<26} {cpu * 1000:>8.1f} {rcpu * 1000:>13.1f} "
                          f"{shown} {rows:>5}")  # fmt: skip
        finally:
            delete_prefix(client, prefix)
            app.close()


if __name__ == "__main__":
    main()
