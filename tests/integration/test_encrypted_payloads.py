"""Encrypted payloads against real Redis: no field value in clear under the prefix, key
rotation, tampering into the failed store with a reason, ``failed show``."""

from __future__ import annotations

import base64
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from tests.integration import encrypted_app as m
from tests.integration.notify_support import make_app, work
from tidings import App, chain
from tidings.cli.main import main
from tidings.jobs.compose import prepare
from tidings.jobs.job import PendingDispatch
from tidings.wire.envelope import read_body, seal

SECRETS = (m.SECRET_EMAIL.encode(), m.SECRET_SSN.encode(), b"glucose-9.9-mmol")
K1 = "first-encryption-key-0123456789"
K2 = "second-encryption-key-987654321"


@pytest.fixture(autouse=True)
def clear_seen() -> Iterator[None]:
    m.SEEN.clear()
    yield
    m.SEEN.clear()


def everything_under(client: redis.Redis, prefix: str) -> bytes:
    """Every key name and value under ``prefix``, whatever the type, as one blob."""
    out: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}*", count=500):
        out.append(key)
        kind = client.type(key)
        if kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"list":
            out.extend(client.lrange(key, 0, -1))
        elif kind == b"hash":
            for k, v in client.hgetall(key).items():
                out += [k, v]
        elif kind == b"zset":
            out.extend(client.zrange(key, 0, -1))
        elif kind == b"set":
            out.extend(client.smembers(key))
        elif kind == b"stream":
            for _, fields in client.xrange(key):
                for k, v in fields.items():
                    out += [k, v]
    assert out, "nothing under the prefix: the scan looked in the wrong place"
    return b"\n".join(out)


def assert_no_clear_text(client: redis.Redis, prefix: str) -> None:
    blob = everything_under(client, prefix)
    for secret in SECRETS:
        assert secret not in blob
        assert base64.b64encode(secret) not in blob


def reseal(body: dict[str, Any], app: App, queue: str) -> bytes:
    """Sign ``body`` as a producer would (binding it to ``queue`` where seal() does)."""
    if "queue" in inspect.signature(seal).parameters:
        return seal(body, app.signer, max_bytes=1 << 20, queue=queue)  # type: ignore[call-arg]
    return seal(body, app.signer, max_bytes=1 << 20)  # type: ignore[arg-type]


def app_with(redis_url: str, prefix: str, **kw: Any) -> App:
    return make_app(redis_url, prefix, None, **kw)


def test_marked_jobs_listeners_notifications_and_chains_are_sealed(
    redis_url: str, redis_client: redis.Redis, prefix: str
) -> None:
    app = app_with(redis_url, prefix)
    app.extend_channel("probe", m.ProbeChannel)
    app.listen(m.Registered, m.AuditRegistration)
    try:
        m.Sealed(m.SECRET_EMAIL, m.SECRET_SSN).dispatch()
        PendingDispatch(m.Sealed(m.SECRET_EMAIL, "x")).on_queue("later").delay(3600).dispatch()
        app.dispatch(m.Registered(m.SECRET_EMAIL))
        m.Patient(1, m.SECRET_EMAIL).notify(m.LabResults("glucose-9.9-mmol"))
        chain(m.Plain("plain-one"), m.Sealed(m.SECRET_EMAIL, m.SECRET_SSN)).dispatch()
        # A plain job stays readable: the check above can find what it looks for.
        assert b"plain-one" in everything_under(redis_client, prefix)
        assert_no_clear_text(redis_client, prefix)

        work(app)
        assert m.SEEN.count((m.SECRET_EMAIL, m.SECRET_SSN)) == 2
        assert ("audit", m.SECRET_EMAIL) in m.SEEN
        assert ("probe", m.SECRET_EMAIL, "glucose-9.9-mmol") in m.SEEN
        assert "plain-one" in m.SEEN
        assert_no_clear_text(redis_client, prefix)
    finally:
        app.close()


def test_the_app_wide_switch_seals_every_job(
    redis_url: str, redis_client: redis.Redis, prefix: str
) -> None:
    app = app_with(redis_url, prefix, encrypt=True)
    try:
        m.Plain(m.SECRET_EMAIL).dispatch()
        assert_no_clear_text(redis_client, prefix)
        work(app)
        assert m.SEEN == [m.SECRET_EMAIL]
    finally:
        app.close()


def test_failed_jobs_stay_sealed_and_failed_show_says_so(
    redis_url: str, redis_client: redis.Redis, prefix: str
) -> None:
    app = app_with(redis_url, prefix, encryption_key=K1)
    try:
        job_id = m.SealedFails(m.SECRET_EMAIL).dispatch()
        work(app)
        [record] = app.queue_for(None).failed()
        assert record.id == job_id and "refused by the handler" in record.exception
        assert_no_clear_text(redis_client, prefix)
        shown = CliRunner().invoke(
            main, ["failed", "show", job_id], obj=None, env=_env(redis_url, prefix, K1)
        )
        assert shown.exit_code == 0, shown.output
        assert "data:      encrypted (AES-256-GCM, key " in shown.output
        assert m.SECRET_EMAIL not in shown.output
        page = _dashboard_detail(app, job_id)
        assert "encrypted: AES-256-GCM, key " in page, page
        sealed = read_body(record.payload, job_id)["data"]  # type: ignore[index]
        assert sealed["v"][:40] not in page  # the ciphertext is not shown either
        assert m.SECRET_EMAIL not in page
        assert app.queue_for(None).retry([job_id]) == 1
        work(app)  # retried from the failed store: still opens (fails again in handle)
        [again] = app.queue_for(None).failed()
        assert "refused by the handler" in again.exception
    finally:
        app.close()


def _dashboard_detail(app: App, job_id: str) -> str:
    """The dashboard's failed-job page, over HTTP against its ASGI app."""
    import asyncio

    import httpx

    from tidings.dashboard import Auth, create_app

    async def get() -> str:
        transport = httpx.ASGITransport(app=create_app(app, auth=Auth()))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            r = await c.get(f"/failed/{job_id}")
            assert r.status_code == 200, r.text
            return r.text

    return asyncio.run(get())


def _env(redis_url: str, prefix: str, key: str) -> dict[str, str]:
    from tests.integration.notify_support import KEY

    return {
        "TIDINGS_REDIS_URL": redis_url, "TIDINGS_KEY": KEY, "TIDINGS_PREFIX": prefix,
        "TIDINGS_ENCRYPTION_KEY": key, "TIDINGS_APP": "",
    }  # fmt: skip


def test_rotation_decrypts_with_any_listed_key_and_refuses_unknown_ones(
    redis_url: str, prefix: str
) -> None:
    old = app_with(redis_url, prefix, encryption_key=K1)
    first = m.Sealed(m.SECRET_EMAIL, "one").dispatch()
    second = PendingDispatch(m.Sealed(m.SECRET_EMAIL, "two")).on_queue("two").dispatch()
    old.close()
    rotated = app_with(redis_url, prefix, encryption_key=f"{K2},{K1}")
    try:
        # One runs under the rotated keys, the other under K2 alone.
        work(rotated)
        assert m.SEEN == [(m.SECRET_EMAIL, "one")]
        new_id = m.Sealed(m.SECRET_EMAIL, "three").dispatch()  # sealed under K2
    finally:
        rotated.close()
    only_new = app_with(redis_url, prefix, encryption_key=K2)
    try:
        work(only_new, queues=["default", "two"])
        assert (m.SECRET_EMAIL, "three") in m.SEEN
        assert (m.SECRET_EMAIL, "two") not in m.SEEN
        [record] = only_new.queue_for(None).failed()
        assert record.id == second and record.id != first and record.id != new_id
        assert "cannot decrypt payload: it was encrypted with key" in record.exception
        assert "TIDINGS_ENCRYPTION_KEY" in record.exception
        assert record.attempts == 1
    finally:
        only_new.close()


def test_tampered_ciphertext_fails_verification_into_the_failed_store(
    redis_url: str, redis_client: redis.Redis, prefix: str
) -> None:
    """Someone holding the signing key but not the encryption key re-signs an altered
    ciphertext: the signature passes, AES-GCM's tag does not."""
    app = app_with(redis_url, prefix, encryption_key=K1)
    try:
        queue, job_id, envelope, _, _ = prepare(
            PendingDispatch(m.Sealed(m.SECRET_EMAIL, "t")), app.signer, max_bytes=1 << 20
        )
        body: Any = read_body(envelope, job_id)
        raw = bytearray(base64.b64decode(body["data"]["v"]))
        raw[20] ^= 0x01
        body["data"]["v"] = base64.b64encode(bytes(raw)).decode()
        forged = reseal(body, app, queue)
        app.queue_for(None).push(queue, [(job_id, forged)], 0)
        work(app)
        assert m.SEEN == []
        [record] = app.queue_for(None).failed()
        assert record.id == job_id
        assert "cannot decrypt payload: verification failed" in record.exception
        assert record.payload == forged  # kept intact, still sealed
    finally:
        app.close()


def test_sealed_data_cannot_move_to_another_job(redis_url: str, prefix: str) -> None:
    app = app_with(redis_url, prefix, encryption_key=K1)
    try:
        queue, _, envelope, _, _ = prepare(
            PendingDispatch(m.Sealed(m.SECRET_EMAIL, "a")), app.signer, max_bytes=1 << 20
        )
        _, other_id, other, _, _ = prepare(
            PendingDispatch(m.Sealed("someone@else.org", "b")), app.signer, max_bytes=1 << 20
        )
        body: Any = read_body(other, other_id)
        body["data"] = read_body(envelope)["data"]  # type: ignore[index]  # A's ciphertext in B
        app.queue_for(None).push(queue, [(other_id, reseal(body, app, queue))], 0)
        work(app)
        [record] = app.queue_for(None).failed()
        assert record.id == other_id and "verification failed" in record.exception
        assert m.SEEN == []
    finally:
        app.close()
