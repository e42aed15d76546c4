"""Time from a fresh checkout to a delivered mail, per framework example.

For each of examples/django_app, fastapi_app, flask_app: clone this repository into a
temporary directory, create a venv, ``pip install -e '.[EXTRA]'``, then type the
example README's commands (embedded Redis, mail to ``./.tidings/outbox``) and stop the
clock when the first ``.eml`` file appears. Prints each command with its duration.

    python benchmarks/first_mail.py [--ref REF] [--smtp] [django fastapi flask]

``--ref REF`` checks out that commit of the clone (``--ref main`` for "before", the
branch for "after"). ``--smtp`` runs the "after" newcomer path of issue 22 instead of
the outbox: a local SMTP sink (aiosmtpd on loopback, in this process) named only by
the framework's own mail settings (Django's ``EMAIL_HOST``/``EMAIL_PORT``; for FastAPI
and Flask ``TIDINGS_MAIL_URL``), and the clock stops when the sink has the mail.

pip uses its usual cache and index; the install time depends on both (say which in a
report). Every process it starts is stopped by pid before it exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EXAMPLES = {
    "django": (
        "django_app",
        [
            "python manage.py migrate",
            "&python manage.py runserver --noreload 127.0.0.1:{port}",
            "curl -s -X POST -d email=ada@myapp.test -d name=Ada http://127.0.0.1:{port}/signup",
            "DJANGO_SETTINGS_MODULE=djsite.settings notify-worker --stop-when-empty",
        ],
    ),
    "fastapi": (
        "fastapi_app",
        [
            "&uvicorn main:api --port {port}",
            "curl -s -X POST -H 'content-type: application/json' "
            '-d \'{{"email": "ada@myapp.test", "name": "Ada"}}\' http://127.0.0.1:{port}/signup',
            "notify-worker -A main:tidings --stop-when-empty",
        ],
    ),
    "flask": (
        "flask_app",
        [
            "&flask --app wsgi run --port {port}",
            "curl -s -X POST -d email=ada@myapp.test -d item=teapot http://127.0.0.1:{port}/orders",
            "notify-worker -A wsgi:tidings_app --stop-when-empty",
        ],
    ),
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


def _step(label: str, cmd: str, cwd: Path, env: dict[str, str]) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, shell=True, cwd=cwd, env=env, check=True, capture_output=True)
    took = time.monotonic() - t0
    print(f"  {took:6.1f} s  {label or cmd}")
    return took


class _Sink:
    """aiosmtpd on loopback, counting messages (only with --smtp)."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages = 0
        sink = self

        class Handler:
            async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
                sink.messages += 1
                return "250 OK"

        self.port = _port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def stop(self) -> None:
        self.controller.stop()


def run(name: str, ref: str | None = None, smtp: bool = False) -> float:
    folder, commands = EXAMPLES[name]
    where = (f" at {ref}" if ref else "") + (" (SMTP)" if smtp else "")
    print(f"{name}: examples/{folder}{where}")
    sink = _Sink() if smtp else None
    servers: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="tidings-first-mail-") as tmp:
        checkout = Path(tmp) / "tidings"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDINGS_", "DJANGO_"))}
        env.pop("VIRTUAL_ENV", None)
        env["PATH"] = f"{checkout / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
        t0 = time.monotonic()
        try:
            _step("", f"git clone -q {ROOT} {checkout}", Path(tmp), env)
            if ref:
                _step("", f"git checkout -q {ref}", checkout, env)
            _step("", f"{sys.executable} -m venv .venv", checkout, env)
            _step("", f".venv/bin/pip install -q -e '.[{name}]'", checkout, env)
            cwd = checkout / "examples" / folder
            port = _port()
            if sink is not None:
                if name == "django":  # Django's own settings name the SMTP server
                    settings = cwd / "djsite" / "settings.py"
                    settings.write_text(settings.read_text() + (
                        f"\nEMAIL_HOST = '127.0.0.1'\nEMAIL_PORT = {sink.port}\n"
                        "DEFAULT_FROM_EMAIL = 'shop@example.org'\n"))  # fmt: skip
                else:
                    env["TIDINGS_MAIL_URL"] = f"smtp://127.0.0.1:{sink.port}?tls=off"
            for template in commands:
                cmd = template.format(port=port)
                if cmd.startswith("&"):
                    t1 = time.monotonic()
                    servers.append(
                        subprocess.Popen(
                            cmd[1:],
                            shell=True,
                            cwd=cwd,
                            env=env,
                            start_new_session=True,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                    )
                    _wait_port(port)
                    print(f"  {time.monotonic() - t1:6.1f} s  {cmd[1:]} &  (until it listens)")
                else:
                    _step("", cmd, cwd, env)
            outbox = cwd / ".tidings" / "outbox"
            deadline = time.monotonic() + 60
            while not (sink.messages if sink is not None else any(outbox.glob("*.eml"))):
                if time.monotonic() > deadline:
                    raise TimeoutError("no mail arrived in 60 s")
                time.sleep(0.05)
            total = time.monotonic() - t0
            print(f"  {total:6.1f} s  total: fresh checkout to a delivered mail\n")
            return total
        finally:
            if sink is not None:
                sink.stop()
            for proc in servers:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
            pid_file = checkout / "examples" / folder / ".tidings" / "redis.pid"
            if pid_file.exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default=None, help="commit to check out (before/after)")
    parser.add_argument("--smtp", action="store_true", help="deliver to a local SMTP sink")
    parser.add_argument("examples", nargs="*", default=list(EXAMPLES))
    args = parser.parse_args()
    totals = {example: run(example, args.ref, args.smtp) for example in args.examples}
    print("summary: " + ", ".join(f"{k} {v:.1f} s" for k, v in totals.items()))
