"""Run the inbox example end to end.

    python examples/inbox/run.py

Starts a local stand-in for Slack's Web API, queues an encrypted InvoicePaid, shows that
Redis holds no clear text, runs ``notify-worker --stop-when-empty``, then lists the
user's unread notifications, marks them read, and prints what Slack received.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

TOKEN = "xoxb-example-0000-bot-token"
posted: list[dict[str, object]] = []


class FakeSlack(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        good = (
            self.path == "/api/chat.postMessage"
            and self.headers["authorization"] == f"Bearer {TOKEN}"
        )
        if good:
            posted.append(body)
        answer = (
            {"ok": True, "ts": "1.0", "channel": body.get("channel")}
            if good
            else {"ok": False, "error": "invalid_auth"}
        )
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def main() -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSlack)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = urllib.parse.quote(f"http://127.0.0.1:{server.server_address[1]}/api", safe="")
    os.environ["TIDINGS_SLACK_URL"] = f"slack://{TOKEN}@default?channel=C0GENERAL&base_url={base}"

    import redis

    from examples.inbox.app import InvoicePaid, User, app

    app.queue_for().clear("default")
    user = User(id=7, name="Ada", email="ada.lovelace@example.org")
    ids = user.notify(InvoicePaid(42, "12.50"))
    print(f"[app] user.notify(InvoicePaid(42)) -> {len(ids)} jobs")

    r = redis.Redis.from_url(app.settings.redis_url)
    blob = b"".join(
        b"".join(r.lrange(k, 0, -1)) if r.type(k) == b"list" else b"" for k in r.scan_iter("*")
    ) + b"".join(b"".join(r.hvals(k)) for k in r.scan_iter("*") if r.type(k) == b"hash")
    print(f"[redis] the email address in clear: {b'ada.lovelace' in blob}")

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidings.cli",
            "-A",
            "examples.inbox.app:app",
            "--stop-when-empty",
            "--sleep",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    print("--- notify-worker --stop-when-empty ---")
    print(done.stdout.rstrip())
    server.shutdown()

    unread = user.unread_notifications()
    for n in unread:
        kind = n.type.rsplit(".", 1)[-1]
        print(f"[inbox] unread {kind} {json.dumps(n.data)} at {n.created_at:%H:%M:%S}")
    marked = user.mark_all_as_read()
    print(f"[inbox] mark_all_as_read() -> {marked}; unread now {len(user.unread_notifications())}")
    for body in posted:
        print(f"[slack] {body['channel']}: {body['text']} ({len(body['blocks'])} blocks)")
    ok = (
        done.returncode == 0
        and len(unread) == 1
        and len(posted) == 1
        and b"ada.lovelace" not in blob
    )
    print("\nOK: encrypted in Redis -> database row + Slack message" if ok else "\nFAILED")
    app.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
