"""Every Redis key name tidings uses, built in one place.

All keys of one queue share the hash tag ``{queue}``, so each Lua script touches one
slot and runs unchanged on Redis Cluster::

    {prefix}:queue:{Q}                ready list of job ids, oldest first
    {prefix}:queue:{Q}:delayed        zset id -> due time (ms, Redis TIME)
    {prefix}:queue:{Q}:reserved       zset id -> lease expiry (ms, Redis TIME), and while
                                      jobs are held one member that is no job (score
                                      +inf, keeps the skiplist encoding: lua/lib/
                                      reserved_skiplist.lua); count with ZCOUNT -inf (+inf
    {prefix}:queue:{Q}:notify         list of wake-up tokens for blocking pops
    {prefix}:queue:{Q}:jobs           hash id -> signed envelope (the body, never rewritten)
    {prefix}:queue:{Q}:attempts       hash id -> reservations so far, id:e -> exceptions,
                                      id:t -> token of the current reservation,
                                      id:s -> stalls (leases that expired)
    {prefix}:queue:{Q}:tokens         counter handing out reservation tokens
    {prefix}:queue:{Q}:rcpt:<what>    receipt of a move, so a re-sent one changes nothing
                                      (pop:<worker>, ack:<worker>, <token>)
    {prefix}:queue:{Q}:done           zset id -> finish time (bounded, for job_status)
    {prefix}:queue:{Q}:failed         zset id -> failure time
    {prefix}:queue:{Q}:failed:info    hash id -> JSON {exception, name, queue, attempts}
    {prefix}:queue:{Q}:failed:body    hash id -> the envelope as it was
    {prefix}:queue:{Q}:prio           zset id -> (100 - priority) * 2^45 + sequence: ready
                                      jobs of a priority other than 0, higher first, FIFO
                                      among equals (priority 0 stays on the ready list)
    {prefix}:queue:{Q}:pseq           the priority sequence; exists only once the queue
                                      saw a priority (queues without keep the fast path)
    {prefix}:queue:{Q}:gon            fair groups marker; exists once the queue saw a
                                      grouped job (queues without keep the fast path)
    {prefix}:queue:{Q}:gring          zset group -> turn: the groups with ready jobs
    {prefix}:queue:{Q}:g:<group>      list of the group's ready job ids (priority 0)
    {prefix}:queue:{Q}:gp:<group>     zset of the group's ready ids of other priorities
    {prefix}:queue:{Q}:gr:<group>     set of the group's reserved ids (its running slots)
    {prefix}:queue:{Q}:gt:<group>     the group's rate state (GCRA, µs), expiring
    {prefix}:queue:{Q}:gcfg           hash p:<g> paused, c:<g> concurrency, r:<g> rate
    {prefix}:queue:{Q}:gstat          hash d:<g> / f:<g>: done / failed while active
    {prefix}:queue:{Q}:gready         count of the queue's grouped ready ids (every group,
                                      paused ones too), kept by the scripts that move ids
                                      into and out of the groups' ready keys
    {prefix}:queue:{Q}:cancelled      zset id -> cancel time (bounded, for job_status)
    {prefix}:queue:{Q}:result:<id>    the job's signed return value (result_ttl_s); also
                                      the pub/sub channel app.result waits on
    {prefix}:queue:{Q}:progress:<id>  JSON {done, total, note, at} of a running job
    {prefix}:restart                  restart signal (a Redis timestamp)
    {prefix}:cancels                  pub/sub channel: ids of running jobs to cancel

Beside a job in the attempts hash: id:p its priority (absent: 0), id:g its fair group, id:c set once
``app.cancel`` asked for it (pop then hands it out as cancelled, never to run).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The key names of one queue."""

    name: str
    ready: str
    delayed: str
    reserved: str
    notify: str
    jobs: str
    attempts: str
    done: str
    failed: str
    failed_info: str
    failed_body: str
    tokens: str
    prio: str
    pseq: str
    cancelled: str
    gon: str
    gring: str
    gcfg: str
    gstat: str
    gready: str

    @classmethod
    def build(cls, prefix: str, name: str) -> QueueKeys:
        """Key names for queue ``name`` under ``prefix``."""
        base = f"{prefix}:queue:{{{name}}}"
        return cls(
            name=name,
            ready=base,
            delayed=f"{base}:delayed",
            reserved=f"{base}:reserved",
            notify=f"{base}:notify",
            jobs=f"{base}:jobs",
            attempts=f"{base}:attempts",
            done=f"{base}:done",
            failed=f"{base}:failed",
            failed_info=f"{base}:failed:info",
            failed_body=f"{base}:failed:body",
            tokens=f"{base}:tokens",
            prio=f"{base}:prio",
            pseq=f"{base}:pseq",
            cancelled=f"{base}:cancelled",
            gon=f"{base}:gon",
            gring=f"{base}:gring",
            gcfg=f"{base}:gcfg",
            gstat=f"{base}:gstat",
            gready=f"{base}:gready",
        )

    def group(self, what: str, group: str) -> str:
        """A fair group's key: ``g`` ready list, ``gp`` priority zset, ``gr`` running set,
        ``gt`` rate state."""
        return f"{self.ready}:{what}:{group}"

    def receipt(self, what: str) -> str:
        """The receipt key of a move: ``pop:<worker>``, ``ack:<worker>`` or a token."""
        return f"{self.ready}:rcpt:{what}"

    def result(self, job_id: str) -> str:
        """The key holding ``job_id``'s stored return value, and the channel its
        waiters listen on (the ack, fail and cancel moves publish there)."""
        return f"{self.ready}:result:{job_id}"

    def progress(self, job_id: str) -> str:
        """The key holding ``job_id``'s last reported progress."""
        return f"{self.ready}:progress:{job_id}"


def restart_key(prefix: str) -> str:
    """The key ``notify-worker restart`` sets."""
    return f"{prefix}:restart"


def cancel_channel(prefix: str) -> str:
    """The pub/sub channel ``app.cancel`` tells workers of a running job on."""
    return f"{prefix}:cancels"


def queue_pattern(prefix: str) -> str:
    """A SCAN pattern matching every queue's jobs hash."""
    return f"{prefix}:queue:{{*}}:jobs"


# -- workflow and flow-control state (chains, batches, unique jobs, limits, schedules) ----
#
#   {prefix}:queue:{Q}:once:<id>         marker: job <id> was pushed once (chain links, callbacks)
#   {prefix}:queue:{Q}:unique:<name>     unique lock: the id of the job holding it
#   {prefix}:queue:{Q}:debounce:<name>   hash: id of the waiting job, first dispatch time
#   {prefix}:queue:{Q}:digest:<name>     list: items of the open digest window (+ :seen zset,
#                                        :window id, :claimed:<id> list being delivered)
#   {prefix}:notify:once:{<name>}        once_per marker of a notification (token, PX)
#   {prefix}:batch:{<id>}                hash: counters, times, options, callback envelopes
#   {prefix}:batch:{<id>}:members        set: ids counted into the batch
#   {prefix}:batch:{<id>}:finished       set: ids whose outcome was recorded
#   {prefix}:batch:{<id>}:failed         set: ids that finally failed
#   {prefix}:batch:{<id>}:retried        set: failed ids sent back by `failed retry`
#   {prefix}:batches                     zset: batch id -> created time (ms), for listing
#   {prefix}:limit:{<key>}               RateLimited state (GCRA arrival time, µs)
#   {prefix}:overlap:{<key>}             WithoutOverlapping lock: the running job's id
#   {prefix}:throttle:{<key>}            ThrottlesExceptions counter
#   {prefix}:schedule:{lease}            scheduler lease: the token of the leading worker
#   {prefix}:queues                      set: queue names workers listened on (for monitor)
#   {prefix}:djtask:{<id>}               hash (+ :w, :e lists): a Django task's failed attempts
#                                        and cancel (tidings.contrib.django.tasks)


def digest_base(prefix: str, queue: str, name: str) -> str:
    """The digest window keys of ``name`` (a hash of notifiable, type, channel) on ``queue``:
    the items list; ``:seen``, ``:window`` and ``:claimed:<window id>`` add to it."""
    return f"{prefix}:queue:{{{queue}}}:digest:{name}"


def notify_once_key(prefix: str, name: str) -> str:
    """The ``once_per`` marker of ``name`` (a hash of notifiable, type and key)."""
    return f"{prefix}:notify:once:{{{name}}}"


def once_key(prefix: str, queue: str, job_id: str) -> str:
    """The marker that job ``job_id`` was pushed once on ``queue``."""
    return f"{prefix}:queue:{{{queue}}}:once:{job_id}"


def unique_key(prefix: str, queue: str, name: str) -> str:
    """The unique lock of ``name`` on ``queue``."""
    return f"{prefix}:queue:{{{queue}}}:unique:{name}"


def debounce_key(prefix: str, queue: str, name: str) -> str:
    """The debounce state of ``name`` on ``queue``."""
    return f"{prefix}:queue:{{{queue}}}:debounce:{name}"


@dataclass(frozen=True, slots=True)
class BatchKeys:
    """The key names of one batch (one hash tag: the batch id)."""

    id: str
    info: str
    members: str
    finished: str
    failed: str
    retried: str

    @classmethod
    def build(cls, prefix: str, batch_id: str) -> BatchKeys:
        """Key names for batch ``batch_id`` under ``prefix``."""
        base = f"{prefix}:batch:{{{batch_id}}}"
        return cls(
            batch_id,
            base,
            f"{base}:members",
            f"{base}:finished",
            f"{base}:failed",
            f"{base}:retried",
        )


def batches_key(prefix: str) -> str:
    """The index of batches, for ``batches list`` and ``prune``."""
    return f"{prefix}:batches"


def limit_key(prefix: str, kind: str, key: str) -> str:
    """State of a job middleware limit: ``kind`` is limit, overlap or throttle."""
    return f"{prefix}:{kind}:{{{key}}}"


def schedule_lease_key(prefix: str) -> str:
    """The scheduler lease."""
    return f"{prefix}:schedule:{{lease}}"


def known_queues_key(prefix: str) -> str:
    """The set of queue names workers have listened on (``monitor`` lists them all)."""
    return f"{prefix}:queues"


# -- broadcasting to browsers (tidings.broadcasting) ---------------------------------------
#
#   {prefix}:broadcast:{streams}:ch:<channel>          stream of one channel's messages
#                                                      (fields e: event name, d: JSON data,
#                                                      m: message id, p: previous entry's id)
#   {prefix}:broadcast:{streams}:ids:<channel>         hash: recent message id -> stream id
#   {prefix}:broadcast:{streams}:idq:<channel>         list: those message ids, newest first
#
# One hash tag for every channel, so a web process reads all its channels with one
# XREAD (one slot on Redis Cluster). The id keys hold the channel's last max_len message
# ids (trimmed with the stream), never a key per message.


def broadcast_stream_key(prefix: str, channel: str) -> str:
    """The stream of broadcast channel ``channel``."""
    return f"{prefix}:broadcast:{{streams}}:ch:{channel}"


def broadcast_ids_keys(prefix: str, channel: str) -> tuple[str, str]:
    """The recent message ids of ``channel`` (a re-sent publish adds nothing): the hash
    message id -> stream id, and the list of those ids, newest first (its trimming order)."""
    base = f"{prefix}:broadcast:{{streams}}"
    return f"{base}:ids:{channel}", f"{base}:idq:{channel}"
