"""The configuration reference, generated from :class:`~tidings.config.Settings`.

Every field of ``Settings`` is a setting: an ``App(...)`` keyword of that name, a
``TIDINGS_<NAME>`` environment variable, a key of Django's ``TIDINGS = {...}`` and a
``TIDINGS_<NAME>`` key of a Flask config. :data:`MEANINGS` says what each one does;
:func:`markdown_table` renders the table the docs site shows (``docs/hooks.py`` puts
it into ``docs/configuration.md`` at build time), with the defaults read from the code.
``tests/unit/test_docs.py`` fails when a field has no entry here, so a new setting
cannot reach a release undocumented.
"""

from __future__ import annotations

import dataclasses

from tidings.config import Settings

# Settings that are resolved but not set by users.
INTERNAL = frozenset({"embedded", "sources"})

MEANINGS: dict[str, str] = {
    "redis_url": (
        "`redis://`, `rediss://` (`?ssl_ca_certs=`), `unix://`, `redis+cluster://`, "
        "`redis+sentinel://host:26379/SERVICE`; `REDIS_URL` is read too. Unset: an "
        "embedded redis-server in the `home` directory (a development default; operator "
        "commands never start one)"
    ),
    "key": (
        "signing key(s), comma-separated (the first signs, all verify); required with "
        "`redis_url`; generated into `HOME/key` for the embedded Redis"
    ),
    "mail_url": (
        "`smtp://user:pass@host:587` (STARTTLS), `smtps://…:465`, `file:///dir` (.eml "
        "files), `log://`; `?tls=required|off`, `?ca=`, `?local_hostname=`, `?pool=N`. "
        "Unset: Django's `EMAIL_*` settings under Django when the project sets any, else "
        "files in `HOME/outbox` (a worker on a real Redis warns of it at start)"
    ),
    "mail_from": (
        "default sender, `Name <addr>` allowed; under Django, `DEFAULT_FROM_EMAIL` when "
        "the project sets it"
    ),
    "sms_url": "`twilio://SID:TOKEN@default?from=…`, `vonage://KEY:SECRET@default?from=…`, `log://`",
    "webhook_secret": "`whsec_…` Standard Webhooks key (unset: webhooks unsigned, a warning)",
    "allowed_modules": (
        "comma-separated module prefixes a worker may import classes from; `tidings` is "
        "always added. Default: the package that created the App; with Django every "
        "installed app and the project package; with Flask the app's package"
    ),
    "retry_after": "seconds a reservation (lease) lasts; the worker renews it while a job runs",
    "prefix": "prefix of every Redis key",
    "webhook_allow_private": "`1` lets webhooks reach private, loopback and link-local addresses",
    "templates": "directory of the app's mail templates",
    "max_payload_bytes": "largest signed payload accepted at dispatch and at pop",
    "envelope_frame": (
        "`2` (default): the compact envelope; `1`: the previous frame, which workers of "
        "earlier versions read: set it on producers during a rolling upgrade until every "
        "worker runs this version"
    ),
    "connections": "extra named Redis URLs for `on_connection(name)` (keyword only: a dict)",
    "database_url": (
        "SQLAlchemy URL of the `database` channel's `notifications` table (SQLite, "
        "PostgreSQL, MySQL); created on first use or by `notify-worker db upgrade`"
    ),
    "slack_url": (
        "`slack://BOT_TOKEN@default?channel=C...` (Web API), an incoming-webhook "
        "`https://` URL, or `log://`"
    ),
    "encrypt": "`1` encrypts every job's data (AES-256-GCM), not only `ShouldBeEncrypted` ones",
    "encryption_key": (
        "AES key(s), comma-separated: the first encrypts, all decrypt (rotation); "
        "unset: derived from `TIDINGS_KEY` with HKDF"
    ),
    "wait_replicas": (
        "replicas that must confirm every push (Redis `WAIT`, pipelined with it) before "
        "`dispatch()` returns; fewer: `QueueUnavailable`. Survives any failover; with one "
        "replica, no dispatch returns while it is out of sync (docs/guarantees.md)"
    ),
    "wait_replicas_timeout": "seconds a push waits for those confirmations",
    "store_results": (
        "`1` keeps every job's return value for `app.result(id)`; a job class's "
        "`store_result = True/False` or a dispatch's `.with_result()` wins"
    ),
    "result_ttl_s": "seconds a kept return value lasts (a job's `result_ttl_s` wins)",
    "result_max_bytes": (
        "the most bytes a kept return value may take, encoded; a larger one fails the job "
        "with `ResultTooLarge` (a job's `result_max_bytes` wins)"
    ),
    "schedule_timezone": (
        "IANA zone (e.g. `Europe/Paris`) whose wall clock cron schedules read when they "
        "give no `tz=`; DST-correct; unset: UTC"
    ),
    "metrics": (
        "`0` turns off the per-job measurements (expiring per-minute buckets), the "
        "measured wait/runtime in `job_status` and worker heartbeats"
    ),
    "after_commit": (
        "`1`: every push (jobs, queued listeners, queued notifications) waits for the "
        "surrounding database transaction to commit and is dropped on rollback; each class "
        "may set `after_commit = True/False` itself"
    ),
    "missing_models": (
        "`fail` or `skip`: what becomes of a job whose model argument's row is gone "
        "(`delete_when_missing_models = True` on a class wins)"
    ),
    "notification_tries": (
        "tries of a queued notification that sets no `tries` of its own, for transient "
        "channel errors (SMTP 4xx or a dropped connection, HTTP 429/5xx, timeouts); "
        "permanent errors (an invalid address, HTTP 4xx, SMTP 5xx) and other exceptions "
        "fail at once. `1`: no retry"
    ),
    "notification_backoff": (
        "seconds before the first retry of such a notification; doubled per attempt with "
        "jitter (half to all of it), up to `notification_backoff_max`; a notification's "
        "own `backoff` wins"
    ),
    "notification_backoff_max": "longest wait between two tries of such a notification (s)",
    "home": (
        "the embedded directory (embedded Redis, its key, the mail outbox, the default "
        "SQLite file); also `TIDINGS_HOME`. Unset: `BASE_DIR/.tidings` under Django, else "
        "`.tidings` beside the module (or script) that creates the App, whatever the "
        "current directory"
    ),
    "mail_allow_test_domains": (
        "`1` accepts test recipients such as `dev@myapp.test` and `root@localhost` "
        "(development and test suites only)"
    ),
}


# Defaults resolved at start (relative to the embedded directory), shown as such.
SHOWN_DEFAULTS = {
    "mail_url": "file://HOME/outbox",
    "database_url": "sqlite:///HOME/notifications.sqlite3",
    "home": "see meaning",
}


def settings() -> list[tuple[str, str, str, str]]:
    """``(keyword, variable, default, meaning)`` per setting, in ``Settings`` order."""
    rows = []
    for f in dataclasses.fields(Settings):
        if f.name in INTERNAL:
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default) if f.default not in (None, "") else "unset"
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "see meaning"
        default = SHOWN_DEFAULTS.get(f.name, default)
        meaning = MEANINGS.get(f.name, "(undocumented: add it to tidings.config_reference)")
        rows.append((f.name, f"TIDINGS_{f.name.upper()}", default, meaning))
    return rows


def undocumented() -> list[str]:
    """Settings fields with no entry in :data:`MEANINGS`."""
    names = [f.name for f in dataclasses.fields(Settings)]
    return [n for n in names if n not in MEANINGS and n not in INTERNAL]


BEGIN = "<!-- tidings:config-reference:begin (generated: python -m tidings.config_reference) -->"
END = "<!-- tidings:config-reference:end -->"


def render_page(text: str) -> str:
    """``text`` (docs/configuration.md) with the table between its markers regenerated."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{markdown_table()}\n{END}{tail}"


def markdown_table() -> str:
    """The reference as a Markdown table."""
    lines = ["| `App(...)` keyword | variable | default | meaning |", "|---|---|---|---|"]
    for name, env, default, meaning in settings():
        cell, text = default.replace("|", "\\|"), meaning.replace("|", "\\|")
        lines.append(f"| `{name}` | `{env}` | `{cell}` | {text} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m tidings.config_reference [PAGE]: regenerate the page
    import sys
    from pathlib import Path

    page = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/configuration.md")
    page.write_text(render_page(page.read_text()))
