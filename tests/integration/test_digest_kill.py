"""A worker SIGKILLed while it sends a digest: every item still ends up in exactly one
digest, and a digest delivered twice is delivered twice whole (same Message-ID, same
items), never in part.

Real Redis, a real ``notify-worker`` process, aiosmtpd holding its DATA reply so the
kill lands mid-send, then an in-process worker that takes the job back once its lease
(1 s) runs out.
"""

from __future__ import annotations

import collections
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tests.integration import rules_app as m
from tests.integration.notify_support import KEY, make_app, parse, parts, work
from tests.support.smtp import Recorder, SmtpServer, wait_until

NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
ROOT = Path(__file__).resolve().parents[2]


class DataRecorder(Recorder):
    """Counts DATA commands whose content arrived (handle_DATA runs after the final
    ".") before the scripted delay holds the reply."""

    data_started = 0

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.data_started += 1
        return await super().handle_DATA(server, session, envelope)


def test_sigkill_mid_digest_send_loses_nothing_and_splits_nothing(
    redis_url: str, prefix: str, spawn_proc: Any
) -> None:
    recorder = DataRecorder(data_delay_s=30.0)  # the worker waits for "250": killed then
    with SmtpServer(recorder=recorder) as smtp:
        mail_url = f"smtp://127.0.0.1:{smtp.port}?tls=off"
        app = make_app(redis_url, prefix, None, mail_url=mail_url, retry_after=1.0)
        try:
            app.make_current()
            members = [m.Member(i) for i in range(1, 5)]
            sent: list[str] = []
            for round_ in range(3):
                for member in members:
                    text = f"{member.id}-{round_}"
                    member.notify(m.SlowReply(text))
                    sent.append(text)
            env = {
                "TIDINGS_REDIS_URL": redis_url, "TIDINGS_KEY": KEY, "TIDINGS_PREFIX": prefix,
                "TIDINGS_MAIL_URL": mail_url, "TIDINGS_RETRY_AFTER": "1",
                "TIDINGS_ALLOWED_MODULES": "tests",
            }  # fmt: skip
            worker = spawn_proc(
                [NOTIFY_WORKER, "-A", "tests.integration.rules_app:app"],
                name="digest-worker",
                extra_env=env,
                cwd=ROOT,
            )
            # The window (3 s) ends, the worker claims a digest and starts sending it.
            assert wait_until(lambda: recorder.data_started, timeout_s=60), worker.tail()
            worker.signal(signal.SIGKILL, group=True)
            assert worker.wait(20) == -9
            rq = app.queue_for(None)
            claimed = rq.client.keys(f"{rq.prefix}:queue:{{default}}:digest:*:claimed:*")
            assert claimed, "the worker was killed before it claimed a digest"

            smtp.recorder.data_delay_s = 0.0
            for member in members[:2]:  # more items after the kill: a new window each
                text = f"{member.id}-late"
                member.notify(m.SlowReply(text))
                sent.append(text)
            # Leases run out (1 s); workers take the killed digest back and send it whole.
            pattern = f"{rq.prefix}:queue:{{default}}:digest:*"
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                work(app)
                left = [k for k in rq.client.keys(pattern) if not k.endswith(b":seen")]
                if not left and rq.client.zcard(rq.keys("default").delayed) == 0:
                    break
                time.sleep(0.3)
            left = [k for k in rq.client.keys(pattern) if not k.endswith(b":seen")]
            assert left == [], left

            by_id: dict[str, list[list[str]]] = collections.defaultdict(list)
            for received in smtp.messages:
                msg = parse(received)
                items = re.findall(r"item:(\S+)", parts(msg)["text/plain"])
                by_id[msg["Message-ID"]].append(items)
            # A digest sent more than once was sent whole each time.
            for copies in by_id.values():
                assert all(c == copies[0] for c in copies), copies
            # Every item is in exactly one digest (one Message-ID).
            seen = collections.Counter(i for copies in by_id.values() for i in copies[0])
            assert sorted(seen) == sorted(sent)
            assert set(seen.values()) == {1}
            assert recorder.data_started > len(smtp.messages)  # the killed sends, re-sent
            # Each digest holds one member's items, oldest first.
            for copies in by_id.values():
                owners = {i.split("-")[0] for i in copies[0]}
                assert len(owners) == 1
                rounds = [i.split("-")[1] for i in copies[0]]
                assert rounds == sorted(rounds, key=lambda r: (r == "late", r))
            print(
                f"\nFIGURE digest kill: {len(smtp.messages)} mails for {len(by_id)} digests "
                f"({len(smtp.messages) - len(by_id)} whole re-sends), {len(sent)} items"
            )
        finally:
            app.close()


def test_sigkill_after_delivery_before_the_claim_is_deleted_resends_it_whole(
    redis_url: str, prefix: str, spawn_proc: Any, tmp_path: Path
) -> None:
    """The worst moment: the digest was delivered (written to the ledger, fsynced) and the
    worker dies before it deletes the claimed list. The re-run sends the same digest
    again, whole, with the same delivery id; no item is in another digest."""
    ledger, marker = tmp_path / "ledger.jsonl", tmp_path / "killed"
    app = make_app(redis_url, prefix, None, retry_after=1.0)
    try:
        app.make_current()
        app.extend_channel("ledger", m.LedgerChannel)
        members = [m.Member(i) for i in range(1, 4)]
        sent = []
        for round_ in range(4):
            for member in members:
                text = f"{member.id}-{round_}"
                member.notify(m.Tally(text))
                sent.append(text)
        env = {
            "TIDINGS_REDIS_URL": redis_url, "TIDINGS_KEY": KEY, "TIDINGS_PREFIX": prefix,
            "TIDINGS_RETRY_AFTER": "1", "TIDINGS_ALLOWED_MODULES": "tests",
            "TIDINGS_TEST_LEDGER": str(ledger), "TIDINGS_TEST_KILL_MARKER": str(marker),
        }  # fmt: skip
        worker = spawn_proc(
            [NOTIFY_WORKER, "-A", "tests.integration.rules_app:app"],
            name="ledger-worker",
            extra_env=env,
            cwd=ROOT,
        )
        assert worker.wait(60) == -9, worker.tail()  # it killed itself after one delivery
        assert marker.exists()
        with m.ledger_env(ledger, None):
            rq = app.queue_for(None)
            pattern = f"{rq.prefix}:queue:{{default}}:digest:*"
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                work(app)
                left = [k for k in rq.client.keys(pattern) if not k.endswith(b":seen")]
                if not left and rq.client.zcard(rq.keys("default").delayed) == 0:
                    break
                time.sleep(0.3)
        lines = [json.loads(line) for line in ledger.read_text().splitlines()]
        by_id: dict[str, list[list[str]]] = collections.defaultdict(list)
        for line in lines:
            by_id[line["id"]].append(line["items"])
        assert len(by_id) == 3  # one digest per member
        twice = [copies for copies in by_id.values() if len(copies) > 1]
        assert len(twice) == 1 and twice[0][0] == twice[0][1]  # the killed one, whole
        seen = collections.Counter(i for copies in by_id.values() for i in copies[0])
        assert sorted(seen) == sorted(sent) and set(seen.values()) == {1}
    finally:
        app.close()
