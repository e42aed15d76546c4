"""Group commit for plain pushes: concurrent producers share one script call.

A producer that finds no push of its queue in flight sends at once (a lone producer
waits for nothing). Producers that arrive while one is in flight join the *next* batch;
when the flight lands, the batch's first producer sends the whole batch as one ``push``
script call (one round trip, one ``WAIT`` when replicas are confirmed). Every producer
returns once its own batch has landed, or raises that batch's error: nothing it pushed
is reported queued before Redis said so.

Safe to re-send: ``push.lua`` skips ids already queued, running, done or failed, so a
batch re-sent after a lost reply lands each job once. A producer's jobs keep their
order: it blocks until its push has landed before it can push the next one.

Only plain pushes are coalesced (one job, no delay, priority 0): delayed, priority,
unique and debounced pushes, and bulk pushes (already one call), take the direct path.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable

from tidings import _forks

Item = tuple[str, bytes]
SendMany = Callable[[str, list[Item]], None]
ASendMany = Callable[[str, list[Item]], Awaitable[None]]

MAX_BATCH = 512
"""Jobs per batch at most: a fuller batch sends, and later arrivals start another."""


def _own_error(exc: BaseException) -> BaseException:
    """A copy of ``exc`` for one caller (several threads raising one exception object
    would interleave their tracebacks on it); ``exc`` itself when it cannot be copied."""
    try:
        copy = type(exc)(*exc.args)
    except Exception:
        return exc
    copy.__cause__ = exc.__cause__
    return copy


def _closed() -> threading.Lock:
    """A held lock: a one-shot gate (cheaper than an ``Event``: no condition)."""
    gate = threading.Lock()
    gate.acquire()
    return gate


class _Batch:
    __slots__ = ("error", "gates", "items", "turn")

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.turn = _closed()  # released when the batch's first producer may send it
        self.gates: list[threading.Lock] = []  # one per other producer: released on landing
        self.error: BaseException | None = None


class _Lane:
    """One queue's state: a push in flight or not, and the batches waiting behind it
    (more than one only when one is full)."""

    __slots__ = ("busy", "waiting")

    def __init__(self) -> None:
        self.busy = False
        self.waiting: deque[_Batch] = deque()


class PushCoalescer:
    """Group commit for threads: see the module doc."""

    def __init__(self, send: SendMany) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._lanes: dict[str, _Lane] = {}
        self._generation = _forks.generation

    def _lane(self, queue: str) -> _Lane:
        lane = self._lanes.get(queue)
        if lane is None:
            lane = self._lanes[queue] = _Lane()
        return lane

    def push(self, queue: str, item: Item) -> None:
        """Push one job, alone or in the next batch of ``queue``."""
        if self._generation != _forks.generation:
            # A forked child: its parent's flights (and maybe its held lock) are not its own.
            self._lock = threading.Lock()
            self._lanes = {}
            self._generation = _forks.generation
        with self._lock:
            lane = self._lane(queue)
            if not lane.busy:
                lane.busy = True
                batch: _Batch | None = None
                leads = True
            else:
                waiting = lane.waiting
                if waiting and len(waiting[-1].items) < MAX_BATCH:
                    batch = waiting[-1]
                    leads = False
                else:
                    batch = _Batch()
                    waiting.append(batch)
                    leads = True
                batch.items.append(item)
                if not leads:
                    gate = _closed()
                    batch.gates.append(gate)
        if batch is None:  # nothing in flight: send now
            self._fly(queue, lane, [item], None)
            return
        if leads:
            try:
                batch.turn.acquire()
            except BaseException:
                # Interrupted (KeyboardInterrupt): others wait on this batch; send it first.
                batch.turn.acquire()
                self._fly(queue, lane, batch.items, batch)
                raise
            self._fly(queue, lane, batch.items, batch)
        else:
            gate.acquire()
        if batch.error is not None:
            raise _own_error(batch.error)

    def _fly(self, queue: str, lane: _Lane, items: list[Item], batch: _Batch | None) -> None:
        """Send ``items``; then hand the flight to the batch waiting behind (if any)."""
        error: BaseException | None = None
        try:
            self._send(queue, items)
        except BaseException as exc:
            error = exc
        finally:
            if batch is not None:
                batch.error = error
            with self._lock:
                # The next batch closes to newcomers: later arrivals start another.
                following = lane.waiting.popleft() if lane.waiting else None
                if following is None:
                    lane.busy = False
            if batch is not None:
                for gate in batch.gates:
                    gate.release()
            if following is not None:
                following.turn.release()
        if error is not None and batch is None:
            raise error


class _ABatch:
    __slots__ = ("items", "waiters")

    def __init__(self) -> None:
        self.items: list[Item] = []
        # One future per producer: a producer cancelled while it waits cancels its own
        # (cheaper than ``asyncio.shield`` around a shared one: no second future and
        # no callbacks per producer).
        self.waiters: list[asyncio.Future[None]] = []


class _ALane:
    __slots__ = ("busy", "waiting")

    def __init__(self) -> None:
        self.busy = False
        self.waiting: deque[_ABatch] = deque()


class AsyncPushCoalescer:
    """Group commit for asyncio tasks (per event loop): see the module doc.

    A batch waiting behind a flight is sent by a task of its own, so a producer
    cancelled while it waits does not strand the others; its job may still land (as a
    push cancelled mid-flight may).
    """

    def __init__(self, send: ASendMany) -> None:
        self._send = send
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _ALane]]
        self._lanes = weakref.WeakKeyDictionary()
        # The last loop's lanes (a weak reference's call instead of a weak-key lookup).
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], dict[str, _ALane]] | None
        self._last = None
        self._tasks: set[asyncio.Task[None]] = set()

    def _lane(self, loop: asyncio.AbstractEventLoop, queue: str) -> _ALane:
        last = self._last
        if last is not None and last[0]() is loop:
            lanes = last[1]
        else:
            got = self._lanes.get(loop)
            if got is None:
                got = self._lanes[loop] = {}
            lanes = got
            self._last = (weakref.ref(loop), lanes)
        lane = lanes.get(queue)
        if lane is None:
            lane = lanes[queue] = _ALane()
        return lane

    async def push(self, queue: str, item: Item) -> None:
        """Push one job, alone or in the next batch of ``queue``."""
        loop = asyncio.get_running_loop()
        lane = self._lane(loop, queue)
        if not lane.busy:
            lane.busy = True
            try:
                await self._send(queue, [item])
            finally:
                self._handover(loop, queue, lane)
            return
        waiting = lane.waiting
        if waiting and len(waiting[-1].items) < MAX_BATCH:
            batch = waiting[-1]
        else:
            batch = _ABatch()
            waiting.append(batch)
        batch.items.append(item)
        landed: asyncio.Future[None] = loop.create_future()
        batch.waiters.append(landed)
        await landed  # the batch's error, each producer's own copy (see _fly)

    def _handover(self, loop: asyncio.AbstractEventLoop, queue: str, lane: _ALane) -> None:
        if not lane.waiting:
            lane.busy = False
            return
        following = lane.waiting.popleft()
        task = loop.create_task(self._fly(queue, lane, following))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fly(self, queue: str, lane: _ALane, batch: _ABatch) -> None:
        try:
            await self._send(queue, batch.items)
        except asyncio.CancelledError:
            for waiter in batch.waiters:
                waiter.cancel()
            raise
        except BaseException as exc:
            for waiter in batch.waiters:
                if not waiter.done():  # not cancelled: its producer is waiting on it
                    waiter.set_exception(_own_error(exc))
                    waiter.exception()  # retrieved: a producer cancelled since logs nothing
        else:
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_result(None)
        finally:
            self._handover(asyncio.get_running_loop(), queue, lane)
