"""Run the sign-up example end to end: worker, event, deliveries.

    python examples/signup/run.py

Starts a local webhook receiver (verifying signatures) and a ``notify-worker``,
registers a user, waits until the mail, SMS and webhook went out, prints them, and
stops the worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# The embedded Redis, key and outbox live under ./.tidings of the current directory.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from examples.signup.app import User, UserRegistered, app  # noqa: E402
from tidings import event  # noqa: E402
from tidings.notifications import verify_webhook  # noqa: E402

received: list[dict[str, object]] = []


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            payload = verify_webhook(app.settings.webhook_secret or "", dict(self.headers), body)
            received.append({"id": self.headers["webhook-id"], "payload": payload})
            self.send_response(204)
        except Exception as exc:  # a bad signature is reported, not crashed on
            print(f"[receiver] rejected: {exc}")
            self.send_response(400)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    # Start clean: jobs left by an interrupted earlier run would point at an old receiver.
    app.queue_for().clear("default")
    app.queue_for().flush()
    outbox = Path(".tidings/outbox")
    before = set(outbox.glob("*.eml")) if outbox.exists() else set()

    worker = subprocess.Popen(
        [sys.executable, "-m", "tidings.cli", "-A", "examples.signup.app:app", "--sleep", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(
        target=lambda: lines.extend(iter(worker.stdout.readline, "")), daemon=True
    ).start()  # type: ignore[union-attr]

    user = User(id=42, name="Ada", email="ada@example.org", phone="+15551234567", webhook_url=url)
    print(f"[app] event(UserRegistered({user.name})) -> {event(UserRegistered(user))}")

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        mails = set(outbox.glob("*.eml")) - before if outbox.exists() else set()
        sms = [ln for ln in lines if "sms" in ln.lower() and "+1555" in ln]
        if mails and sms and received:
            break
        time.sleep(0.1)
    worker.send_signal(signal.SIGTERM)
    code = worker.wait(timeout=30)
    server.shutdown()

    print("\n--- worker output ---")
    print("".join(lines).rstrip())
    print("\n--- delivered ---")
    mails = sorted(set(outbox.glob("*.eml")) - before) if outbox.exists() else []
    for path in mails:
        head = [
            ln
            for ln in path.read_text().splitlines()
            if ln.split(":")[0] in ("To", "Subject", "Message-ID")
        ]
        print(f"mail    {path}: " + " | ".join(head))
    for ln in lines:
        if "sms" in ln.lower() and "+1555" in ln:
            print(f"sms     {ln.strip()}")
    for hook in received:
        print(f"webhook verified id={hook['id']} payload={json.dumps(hook['payload'])}")
    ok = bool(mails) and bool(received) and any("+1555" in ln for ln in lines) and code == 0
    print(
        "\nOK: event -> queued listener -> notification by mail, sms and webhook"
        if ok
        else "\nFAILED"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
