"""The Tasks conformance suite on Django 6's own ``django.tasks`` (issue 24).

Django 6 needs Python >= 3.12 and the main suite runs on 3.11 with the ``django-tasks``
backport, so this runs ``test_django_tasks_conformance.py`` again in the venv
``scripts/django6-venv`` makes (``.venv-django6``, or the interpreter named by
``TIDINGS_DJANGO6_PYTHON`` if it has Django 6 and this tree installed). Where neither
exists this case is skipped, and the skip says so: the Django 6 variant was not run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _django6_python() -> tuple[str | None, str]:
    """The interpreter with Django >= 6 and tidings, or None and why not."""
    candidates = [
        os.environ.get("TIDINGS_DJANGO6_PYTHON", ""),
        str(ROOT / ".venv-django6/bin/python"),
    ]
    tried = []
    for py in filter(None, candidates):
        if not Path(py).exists():
            tried.append(f"{py}: absent")
            continue
        probe = subprocess.run(
            [py, "-c", "import django, tidings; print(django.VERSION[0])"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        major = probe.stdout.strip()
        if probe.returncode == 0 and major.isdigit() and int(major) >= 6:
            return py, ""
        tried.append(f"{py}: {probe.stderr.strip().splitlines()[-1:] or major}")
    return None, "; ".join(tried)


def test_conformance_suite_passes_on_django_6(plain_redis_url: str) -> None:
    py, why = _django6_python()
    if py is None:
        pytest.skip(
            "Django 6 variant NOT run: no Python >= 3.12 venv with Django 6 here "
            f"({why}); make one with scripts/django6-venv"
        )
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env["TIDINGS_TEST_REDIS_URL"] = plain_redis_url
    run = subprocess.run(
        [py, "-m", "pytest", "tests/integration/test_django_tasks_conformance.py", "-q",
         "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    tail = run.stdout[-3000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail.splitlines()[-1], tail
