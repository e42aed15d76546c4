"""``notify-worker supervise``: run the App's pools on this host.

One supervisor process runs child worker processes per pool through the supervisor of
:mod:`tidings.ops.supervisor` (restart with backoff, memory limit, graceful SIGTERM,
hard kill of stuck children, the ``restart`` broadcast all apply to every child). A
thread beside its loop talks to Redis once a second (:mod:`tidings.pools.coordination`)
and sets each pool's wanted processes; the loop starts children up to it (within this
host's ``max_processes``, draining children counted) and retires the surplus: the child
with the fewest running jobs gets SIGTERM, finishes its jobs and is not restarted.

Redis away: the thread logs it once and the wanted numbers stay as they are: no child
is started or retired for balancing (crashed children are still restarted) until Redis
answers again. Children get SIGTERM if the supervisor dies (``PR_SET_PDEATHSIG``), so a
killed supervisor leaves no workers behind running outside any plan.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
import time
from collections.abc import Sequence

from tidings.ops.supervisor import Supervisor, _Child, _log
from tidings.pools.coordination import Coordinator, LocalPool
from tidings.pools.spec import Pool, PoolsConfig
from tidings.redis.errors import REDIS_ERRORS

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover (runs in the child before exec)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass


def child_argv(app_spec: str, pool: Pool, extra: Sequence[str]) -> list[str]:
    """The worker command line of one pool's child."""
    return [sys.executable, "-m", "tidings.cli.main", "-A", app_spec,
            "--queue", ",".join(pool.queues), "--concurrency", str(pool.concurrency),
            *extra]  # fmt: skip


class PoolSupervisor(Supervisor):
    """Children per pool, as many as the coordination thread wants (module docstring)."""

    def __init__(
        self,
        config: PoolsConfig,
        app_spec: str,
        coordinator: Coordinator | None,
        *,
        extra_args: Sequence[str] = (),
        grace_s: float = 30.0,
        timeout_s: float = 60.0,
        interval_s: float = 1.0,
    ) -> None:
        super().__init__(0, [sys.argv[0]], grace_s=grace_s, timeout_s=timeout_s)
        self.config = config
        self.coordinator = coordinator
        self.interval_s = interval_s
        self.preexec_fn = _die_with_parent if sys.platform.startswith("linux") else None
        self.cmds = {p.name: child_argv(app_spec, p, extra_args) for p in config.pools}
        fixed = config.balance == "off" or coordinator is None
        self.wanted: dict[str, int] = {
            p.name: p.max_processes if fixed else p.min_processes for p in config.pools
        }
        self._fit_host_max()
        self._slots = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.redis_ok = True
        self.scaled = 0  # children started or retired for balancing

    def _fit_host_max(self) -> None:
        over = sum(self.wanted.values()) - self.config.host_max
        for p in sorted(self.config.pools, key=lambda p: -self.wanted[p.name]):
            while over > 0 and self.wanted[p.name] > p.min_processes:
                self.wanted[p.name] -= 1
                over -= 1

    def local(self) -> dict[str, LocalPool]:
        """This host's processes and running jobs per pool."""
        with self._lock:
            children = list(self.children)
        out = {p.name: LocalPool() for p in self.config.pools}
        for c in children:
            mine = out[c.pool]
            mine.alive += 1
            if not c.retiring:
                mine.active += 1
                mine.running += c.running()
        return out

    # -- the coordination thread ---------------------------------------------------------

    def _coordinate(self) -> None:
        assert self.coordinator is not None
        while not self._stop.wait(self.interval_s):
            try:
                share = self.coordinator.step(self.local(), time.time())
            except REDIS_ERRORS as exc:
                if self.redis_ok:
                    _log(f"Redis unavailable ({type(exc).__name__}); keeping "
                         f"{sum(self.wanted.values())} processes, not balancing until it "
                         "returns")  # fmt: skip
                self.redis_ok = False
                continue
            except Exception as exc:  # a bad report must not stop balancing
                _log(f"balancing step failed: {type(exc).__name__}: {exc}")
                continue
            if not self.redis_ok:
                _log("Redis is back; balancing again")
                self.redis_ok = True
            if share is not None:
                self.wanted = {p.name: share.get(p.name, self.wanted[p.name])
                               for p in self.config.pools}  # fmt: skip

    # -- the supervisor loop -------------------------------------------------------------

    def _add(self, pool: Pool) -> None:
        self._slots += 1
        child = _Child(self._slots - 1, self.dir / f"worker-{self._slots}",
                       cmd=self.cmds[pool.name], env={"TIDINGS_POOL": pool.name},
                       pool=pool.name)  # fmt: skip
        with self._lock:
            self.children.append(child)
        self._start(child)

    def _retire(self, pool: Pool) -> None:
        mine = [c for c in self.children if c.pool == pool.name and not c.retiring]
        if not mine:
            return
        child = min(mine, key=lambda c: (c.running(), -c.started))
        child.retiring = True
        if child.proc is None:  # waiting for a restart: just drop it
            with self._lock:
                self.children.remove(child)
            return
        _log(f"pool {pool.name}: retiring worker {child.proc.pid} "
             f"({child.running()} running jobs finish first)")  # fmt: skip
        child.term_at = time.monotonic()
        self._signal(child, signal.SIGTERM)

    def tick(self, now: float) -> None:
        alive = len(self.children)
        for pool in self.config.pools:
            want = self.wanted[pool.name]
            active = sum(1 for c in self.children if c.pool == pool.name and not c.retiring)
            while active > want:
                self._retire(pool)
                active -= 1
                self.scaled += 1
            while active < want and alive < self.config.host_max:
                self._add(pool)
                active += 1
                alive += 1
                self.scaled += 1

    def run(self) -> int:
        thread = None
        if self.coordinator is not None and self.config.balance == "auto":
            thread = threading.Thread(target=self._coordinate, name="pools", daemon=True)
            thread.start()
        try:
            return super().run()
        finally:
            self._stop.set()
            if thread is not None:
                thread.join(timeout=5)
                try:
                    assert self.coordinator is not None
                    self.coordinator.leave()
                except REDIS_ERRORS:
                    pass  # the report and the lease lapse by themselves within a lease
