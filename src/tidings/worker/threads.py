"""Where sync handlers run: long-lived threads fed in batches, settled back in batches.

A sync ``handle()`` cannot run on the event loop's thread: it may block for as long as
it likes (a database query, an HTTP call) and libraries refuse to run in a thread with a
running loop (Django's ORM raises ``SynchronousOnlyOperation`` there). It used to go
through ``loop.run_in_executor``, which pays, per job, a ``concurrent.futures.Future``
wrapped in an asyncio one, a thread woken through a queue, a timer for the timeout and a
write to the loop's self-pipe to hand the result back: on a 2-core machine the loop and
the thread then take turns job by job, each waking the other (py-spy: the loop sat in
``epoll`` or waited for the GIL two thirds of the time, the threads were idle 99 %).

:class:`SyncRunner` keeps the threads and changes the hand-off:

* **In**: :meth:`SyncRunner.submit` appends to a deque and wakes a thread only when no
  thread is awake (about to take a job, or inside a handler and so coming back for the
  next). A thread that finishes a job takes the next one without sleeping, so a burst
  of jobs popped together runs on one thread with one wake-up.
* **Out**: a finished job goes to a second deque; the loop is woken (one
  ``call_soon_threadsafe``) only when no wake-up is pending already, and then settles
  everything that finished since, in one callback.
* **No job waits behind a blocking one**: while jobs wait in the deque, a timer on the
  loop checks every :data:`STALL_S` that the threads are taking them; if none was taken
  since the last check (every awake thread is inside a handler), one more thread is
  woken, up to ``max_threads`` (the worker's ``--concurrency``), so slow handlers still
  run side by side as in a thread pool.
* **An idle worker's job**: when it is the only one in flight and a thread must be
  woken for it, the loop waits (up to :data:`HANDOVER_S`) until the thread has taken
  it, rather than going on with its next steps (sending the next blocking wait) while
  the thread waits for the GIL: the handler starts one thread wake-up after the job.
* **Timeouts**: one loop timer at the earliest deadline of the jobs in flight (not one
  per job). A job past its deadline has its future failed with :class:`Overran`; its
  thread cannot be stopped and stays counted in :attr:`SyncRunner.busy`, which is how
  the worker knows it must exit without joining it (``EXIT_STUCK``).

Handlers run in the context (``contextvars``) they were submitted with, on threads named
``<prefix>_<n>``; thread-local state (a Django database connection, say) lives as long as
its thread, which is as long as the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

STALL_S = 0.002
"""How long jobs may wait in the deque with no thread taking any before another thread
is woken (the cost, at most, of a handler that blocks while others are queued)."""


HANDOVER_S = 0.002
"""How long an idle worker's loop waits for a woken thread to take the one job in flight."""


class Overran(Exception):
    """A sync handler ran past its deadline (it is still running in its thread)."""


class _Item:
    __slots__ = ("ctx", "deadline", "error", "fn", "fut", "result")

    def __init__(
        self,
        fn: Callable[[], Any],
        ctx: contextvars.Context,
        fut: asyncio.Future[Any],
        deadline: float | None,
    ) -> None:
        self.fn = fn
        self.ctx = ctx
        self.fut = fut
        self.deadline = deadline
        self.result: Any = None
        self.error: BaseException | None = None


class SyncRunner:
    """Runs sync callables on up to ``max_threads`` long-lived threads (see the module
    docstring). Bound to the event loop that first calls :meth:`submit`."""

    def __init__(self, max_threads: int, thread_name_prefix: str = "job") -> None:
        self.max_threads = max(1, max_threads)
        self._prefix = thread_name_prefix
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._todo: deque[_Item] = deque()
        self._done: deque[_Item] = deque()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads asleep on the condition
        self._free = 0  # threads awake and about to take a job (none sleeps while jobs wait)
        self._taken = 0  # jobs taken by threads so far (the stall check compares it)
        self._settling = False  # a settle callback is scheduled on the loop
        self._stall: asyncio.TimerHandle | None = None
        self._stall_taken = 0
        self._timed: dict[_Item, None] = {}  # in flight with a deadline, oldest first
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_at = 0.0
        self._handover = False  # the loop waits on _handed until a thread takes a job
        self._handed = threading.Event()
        self._closed = False
        self.busy = 0
        """Handlers running in a thread right now (a stuck one included)."""

    # -- the loop's side -------------------------------------------------------------

    def submit(
        self,
        fn: Callable[[], Any],
        ctx: contextvars.Context,
        timeout_s: float | None = None,
        *,
        alone: bool = False,
    ) -> asyncio.Future[Any]:
        """Run ``ctx.run(fn)`` in a thread; a future of its result. With ``timeout_s``,
        the future fails with :class:`Overran` once it is due and the call still runs.

        ``alone``: nothing else is in flight on the loop. If a sleeping thread has to be
        woken for this job, the loop then waits (at most :data:`HANDOVER_S`) until that
        thread has taken it, so the handler starts as soon as the thread is up instead
        of after the loop's next steps (the latency path of an idle worker)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if self._closed:
            raise RuntimeError("SyncRunner is closed")
        fut = loop.create_future()
        deadline = loop.time() + timeout_s if timeout_s else None
        item = _Item(fn, ctx, fut, deadline)
        handover = False
        with self._lock:
            self._todo.append(item)
            # No thread is awake: wake one. A thread inside a handler takes this job when
            # it is done; if it blocks, the stall check adds a thread.
            if not self._free and not self.busy and self._add_thread() and alone:
                handover = self._handover = True
                self._handed.clear()
        if handover:
            self._handed.wait(HANDOVER_S)
        if self._stall is None:
            self._stall_taken = self._taken
            self._stall = loop.call_later(STALL_S, self._check_stall)
        if deadline is not None:
            self._timed[item] = None
            if self._deadline is None or deadline < self._deadline_at:
                if self._deadline is not None:
                    self._deadline.cancel()
                self._deadline_at = deadline
                self._deadline = loop.call_at(deadline, self._check_deadlines)
        return fut

    def _add_thread(self) -> bool:
        """Wake a sleeping thread or start one (lock held); False at ``max_threads``."""
        if self._idle:
            self._idle -= 1
            self._free += 1
            self._wake.notify()
            return True
        if len(self._threads) < self.max_threads:
            self._free += 1
            t = threading.Thread(
                target=self._work, name=f"{self._prefix}_{len(self._threads)}", daemon=True
            )
            self._threads.append(t)
            t.start()
            return True
        return False

    def _check_stall(self) -> None:
        self._stall = None
        if not self._todo:
            return
        with self._lock:
            if self._todo and not self._free and self._taken == self._stall_taken:
                # Every awake thread is inside a handler: do not let the queued wait.
                self._add_thread()
        assert self._loop is not None
        self._stall_taken = self._taken
        self._stall = self._loop.call_later(STALL_S, self._check_stall)

    def _check_deadlines(self) -> None:
        self._deadline = None
        assert self._loop is not None
        now = self._loop.time()
        soonest: float | None = None
        for item in list(self._timed):
            deadline = item.deadline
            assert deadline is not None
            if deadline <= now:
                del self._timed[item]
                if not item.fut.done():
                    item.fut.set_exception(Overran())
            elif soonest is None or deadline < soonest:
                soonest = deadline
        if soonest is not None:
            self._deadline_at = soonest
            self._deadline = self._loop.call_at(soonest, self._check_deadlines)

    def _settle(self) -> None:
        self._settling = False
        done = self._done
        timed = self._timed
        while done:
            item = done.popleft()
            if item.deadline is not None:
                timed.pop(item, None)
            fut = item.fut
            if fut.done():  # cancelled (grace period over) or already timed out
                continue
            if item.error is not None:
                fut.set_exception(item.error)
            else:
                fut.set_result(item.result)

    def close(self, *, wait: bool) -> None:
        """Let the threads end once idle; with ``wait``, join them (never a busy one)."""
        with self._lock:
            self._closed = True
            self._todo.clear()
            self._free += self._idle
            self._idle = 0
            self._wake.notify_all()
        for handle in (self._stall, self._deadline):
            if handle is not None:
                handle.cancel()
        self._stall = self._deadline = None
        if wait and not self.busy:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join(5.0)

    # -- the threads' side -----------------------------------------------------------

    def _work(self) -> None:
        lock, todo, done = self._lock, self._todo, self._done
        lock.acquire()
        self._free -= 1  # from here on this thread counts as busy or idle
        try:
            while True:
                while not todo:
                    if self._closed:
                        return
                    self._idle += 1
                    self._wake.wait()  # the waker moved this thread from _idle to _free
                    self._free -= 1
                item = todo.popleft()
                if self._handover:
                    self._handover = False
                    self._handed.set()
                self._taken += 1
                self.busy += 1
                lock.release()
                try:
                    item.result = item.ctx.run(item.fn)
                except BaseException as exc:  # handed to the awaiting task as it is
                    item.error = exc
                item.ctx = item.fn = None  # type: ignore[assignment]
                done.append(item)
                # One wake-up of the loop settles every job finished until it runs (it
                # waits for the GIL while this thread goes on). Waking it only at the end
                # of a batch measured no better: its slots then refill later.
                if not self._settling:
                    self._settling = True
                    # RuntimeError: the loop is closed, nobody waits for a result.
                    with contextlib.suppress(RuntimeError):
                        self._loop.call_soon_threadsafe(self._settle)  # type: ignore[union-attr]
                lock.acquire()
                self.busy -= 1
        finally:
            lock.release()
