"""How many files one queued listener's job passes through, from ``event()`` to its ack.

Dispatches one event whose listener is queued, runs a worker in this process until the
queue is empty, and records every tidings module a Python function of ran in (a
profile hook) and every Lua script sent. Run it against any checkout with
``PYTHONPATH=<checkout>/src python benchmarks/follow_one_job.py``: the count is what a
reader opens to follow one job, the figure issue 21 compares before and after.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _redis import bench_redis


@dataclass
class Signed:
    user: int


class Welcome:  # made a queued listener in main(), once tidings is importable
    pass


def main() -> int:
    import tidings
    from tidings import App, Listener, ShouldQueue, event

    try:
        from tidings.worker.worker import Worker, WorkerOptions

        scripts_mod = "tidings.redis.scripts"
    except ImportError:  # the layout before issue 21
        from tidings.queue.worker import Worker, WorkerOptions  # type: ignore[no-redef]

        scripts_mod = "tidings.queue.scripts"
    import importlib

    scripts = importlib.import_module(scripts_mod)
    root = str(Path(tidings.__file__).parent)

    global Welcome

    class Welcome(Listener, ShouldQueue):  # type: ignore[no-redef]
        def handle(self, e: Signed) -> None:
            pass

    Welcome.__qualname__ = "Welcome"
    Welcome.__module__ = Signed.__module__ = "follow_one_job"
    sys.modules["follow_one_job"] = sys.modules[__name__]

    with bench_redis() as server:
        app = App(redis_url=server.url, key="k" * 32, prefix="follow", env=False,
                  allowed_modules=["follow_one_job", "tidings"])  # fmt: skip
        app.listen(Signed, Welcome)
        files: set[str] = set()
        lua: set[str] = set()
        orig_call, orig_acall = scripts.LuaScript.call, scripts.LuaScript.acall

        def call(self, *a, **k):  # type: ignore[no-untyped-def]
            lua.add(self.name)
            return orig_call(self, *a, **k)

        async def acall(self, *a, **k):  # type: ignore[no-untyped-def]
            lua.add(self.name)
            return await orig_acall(self, *a, **k)

        scripts.LuaScript.call, scripts.LuaScript.acall = call, acall

        def hook(frame, what, arg):  # type: ignore[no-untyped-def]
            f = frame.f_code.co_filename
            if f.startswith(root):
                files.add(os.path.relpath(f, root))

        # Warm imports first, so module-level code is not counted as "the job's path".
        app.queue_for(None).client.ping()
        sys.setprofile(hook)
        import threading

        threading.setprofile(hook)
        event(Signed(1))
        worker = Worker(app, WorkerOptions(queues=["default"], stop_when_empty=True, sleep_s=1))
        asyncio.run(worker.run())
        sys.setprofile(None)
        threading.setprofile(None)
        app.close()
    print(f"{len(files)} Python modules, {len(lua)} Lua scripts")
    for f in sorted(files):
        print("  ", f)
    print("   lua:", ", ".join(sorted(lua)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
