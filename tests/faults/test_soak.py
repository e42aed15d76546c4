"""Full-size load and soak runs through benchmarks/soak.py; ``pytest -m soak`` only
(the README's ``make test`` deselects the marker). Each asserts lost 0 and the extra-run
bound that soak.py prints."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.faults.conftest import ROOT, base_env, figure

pytestmark = pytest.mark.soak


def _soak(*args: str, timeout_s: float) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), *args],
        env=base_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        start_new_session=True,
    )
    figure(f"soak.py {' '.join(args)}\n{done.stdout}")
    assert done.returncode == 0, done.stdout + done.stderr
    return {m[0]: m[1] for m in re.findall(r"^(\w[\w ]*?)\s{2,}(.*)$", done.stdout, re.M)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "args", [[], ["--kills", "3"], ["--restart-redis"]], ids=["L1", "L2", "L3"]
)
def test_full_size_100k_jobs_10_workers(args: list[str]) -> None:
    out = _soak("--jobs", "100000", "--workers", "10", *args, timeout_s=850)
    assert out["lost"] == "0"
    assert "'reserved': 0" in out["queue left"]


@pytest.mark.timeout(1500)
def test_l7_15_minutes_at_500_jobs_per_second_with_a_kill_every_minute() -> None:
    out = _soak("--rate", "500", "--duration", "900", "--kill-every", "60", timeout_s=1400)
    assert out["lost"] == "0"
    growth = re.search(r"max ([+-][\d.]+)%", out.get("worker RSS", ""))
    assert growth is not None and float(growth.group(1)) < 20
