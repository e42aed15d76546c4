"""Time from ``startproject`` to a task's ``get_result()`` returning SUCCESSFUL, doing
exactly what docs/tutorials/django-tasks.md says (issue 24):

    python -m benchmarks.django_tasks_tutorial [--keep]

The code blocks of the page's "From startproject to a result" section are taken from
the page itself, so the page is what runs: the ``sh`` blocks as a bash script in a
temporary directory, the ``# mysite/settings.py (at the end)`` block appended to the
generated settings, the ``# myapp/tasks.py`` block written there, the worker command
started in the background, and the ``# python manage.py shell`` block fed to
``python manage.py shell``. Two things differ from a reader's machine: ``pip install``
is skipped (this venv has tidings installed from the work tree, which is not on the
package index), and a throwaway redis-server is started and named by
``TIDINGS_REDIS_URL`` (the page says a Redis is needed and that variable names it).
Exits non-zero, with the output, unless the shell block printed SUCCESSFUL.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._redis import bench_redis

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tutorials" / "django-tasks.md"
SECTION = "## From `startproject` to a result"


def blocks(page: str) -> list[tuple[str, str]]:
    """``(language, text)`` of each fenced block of the tutorial's section."""
    start = page.index(SECTION)
    end = page.find("\n## ", start + len(SECTION))
    section = page[start : end if end != -1 else len(page)]
    return [(m[1], m[2]) for m in re.finditer(r"```(\w+)\n(.*?)```", section, re.S)]


def script(page: str, here: Path) -> tuple[str, str]:
    """The bash script the section describes, and the shell block's Python."""
    steps: list[str] = ["set -euo pipefail"]
    shell_input = ""
    for lang, text in blocks(page):
        first = text.splitlines()[0]
        if lang == "sh":
            for line in text.splitlines():
                command = line.split("#", 1)[0].strip() if not line.startswith("export") else line
                if not command or command.startswith("pip install"):
                    continue  # installed already (see the module docstring)
                if "notify-worker" in command:
                    steps.append(f"{command} > {shlex.quote(str(here / 'worker.log'))} 2>&1 &")
                    steps.append(f"echo $! > {shlex.quote(str(here / 'worker.pid'))}")
                else:
                    steps.append(command)
        elif first.startswith("# mysite/settings.py"):
            steps.append(f"cat >> mysite/settings.py <<'TUTORIAL_EOF'\n{text}TUTORIAL_EOF")
        elif first.startswith("# myapp/tasks.py"):
            steps.append(f"cat > myapp/tasks.py <<'TUTORIAL_EOF'\n{text}TUTORIAL_EOF")
        elif first.startswith("# python manage.py shell"):
            shell_input = text
            steps.append(
                "timeout 120 python manage.py shell < " + shlex.quote(str(here / "shell.py"))
            )
    return "\n".join(steps) + "\n", shell_input


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the project directory")
    a = parser.parse_args()
    page = PAGE.read_text()
    here = Path(tempfile.mkdtemp(prefix="tidings-tutorial-"))
    bash, shell_input = script(page, here)
    (here / "shell.py").write_text(shell_input)
    (here / "tutorial.sh").write_text(bash)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDINGS_", "DJANGO_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    try:
        with bench_redis() as server:
            env["TIDINGS_REDIS_URL"] = server.url
            t0 = time.perf_counter()
            out = subprocess.run(
                ["bash", str(here / "tutorial.sh")], cwd=here, env=env,
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            elapsed = time.perf_counter() - t0
    finally:
        pid = here / "worker.pid"
        if pid.exists():  # the worker the page started: stopped by its PID
            subprocess.run(["kill", pid.read_text().strip()], check=False)
            time.sleep(0.5)
    ok = out.returncode == 0 and "SUCCESSFUL" in out.stdout
    print(out.stdout[-2000:])
    if not ok:
        print(out.stderr[-4000:], file=sys.stderr)
        log = here / "worker.log"
        if log.exists():
            print(log.read_text()[-4000:], file=sys.stderr)
    print(
        f"startproject -> get_result() SUCCESSFUL: {elapsed:.1f} s "
        f"({'ok' if ok else 'FAILED'}; busy machine; pip install not timed)"
    )
    if not a.keep:
        shutil.rmtree(here, ignore_errors=True)
    else:
        print(f"kept: {here}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
