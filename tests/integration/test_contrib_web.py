"""The FastAPI lifespan, the Flask extension, the test-address switch and the new
settings, against a real Redis on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from flask import Flask

from tidings import App, ConfigurationError, QueueUnavailable, ValidationError
from tidings.config import Settings
from tidings.contrib.fastapi import lifespan
from tidings.contrib.flask import Tidings, options_from_config
from tidings.notifications import validation

KEY = "w" * 32


@pytest.fixture(autouse=True)
def _test_domains_off(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("TIDINGS_EMAIL_TEST_DOMAINS", raising=False)
    monkeypatch.delenv("TIDINGS_MAIL_ALLOW_TEST_DOMAINS", raising=False)
    validation.allow_test_domains(False)
    yield
    validation.allow_test_domains(False)


def test_the_lifespan_opens_and_closes_the_apps_clients(redis_url: str, prefix: str) -> None:
    app = App(redis_url=redis_url, key=KEY, prefix=prefix)
    App(redis_url=redis_url, key=KEY, prefix=prefix + "x")  # another one is current now
    api = FastAPI(lifespan=lifespan(app))
    seen: dict[str, object] = {}

    @api.get("/")
    async def index() -> dict[str, bool]:
        seen["current"] = App.current()
        seen["clients"] = len(app.queue_for(None)._async)
        return {"ok": True}

    async def serve() -> None:
        # The lifespan as Starlette runs it, then a request through the ASGI app.
        async with api.router.lifespan_context(api) as state:
            assert state == {"tidings": app}
            assert len(app.queue_for(None)._async) == 1  # opened (and pinged) at start-up
            transport = httpx.ASGITransport(app=api)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                assert (await client.get("/")).json() == {"ok": True}
        assert app.queue_for(None)._async == {}  # closed at shutdown

    asyncio.run(serve())
    assert seen == {"current": app, "clients": 1}


def test_the_lifespan_fails_start_up_when_redis_is_unreachable(prefix: str) -> None:
    from tests.support.procs import free_port

    app = App(redis_url=f"redis://127.0.0.1:{free_port()}/0", key=KEY, prefix=prefix)
    api = FastAPI(lifespan=lifespan(lambda: app))

    async def start() -> None:
        async with api.router.lifespan_context(api):
            pass

    with pytest.raises(QueueUnavailable, match=r"(?i)connect"):
        asyncio.run(start())


def test_the_flask_extension_reads_tidings_keys(redis_url: str, prefix: str) -> None:
    flask_app = Flask("shopfront")
    flask_app.config.update(
        TIDINGS_REDIS_URL=redis_url,
        TIDINGS_KEY=KEY,
        TIDINGS_PREFIX=prefix,
        TIDINGS_AFTER_COMMIT=True,
        TIDINGS_MAIL_FROM="shop@example.org",
        OTHER="x",
    )
    assert options_from_config(flask_app.config)["after_commit"] is True
    ext = Tidings()
    with pytest.raises(ConfigurationError, match="init_app"):
        _ = ext.app
    app = ext.init_app(flask_app)
    assert ext.app is app is flask_app.extensions["tidings"] is App.current()
    assert app.settings.prefix == prefix and app.settings.after_commit is True
    assert app.settings.mail_from == "shop@example.org"
    assert app.settings.allowed_modules == ("shopfront", "tidings")
    assert app.queue_for(None).client.ping()
    app.close()


@pytest.mark.parametrize("address", ["dev@myapp.test", "root@localhost"])
def test_test_addresses_need_the_documented_switch(
    address: str, redis_url: str, prefix: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        validation.validate_email(address, "to")
    assert "TIDINGS_MAIL_ALLOW_TEST_DOMAINS=1" in str(caught.value)
    assert "App(mail_allow_test_domains=True)" in str(caught.value)
    app = App(redis_url=redis_url, key=KEY, prefix=prefix, mail_allow_test_domains=True)
    assert validation.validate_email(address, "to") == address
    app.close()


def test_the_switch_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDINGS_MAIL_ALLOW_TEST_DOMAINS", "1")
    assert validation.validate_email("root@localhost", "to") == "root@localhost"
    with pytest.raises(ValidationError):  # still a syntax check of the local part
        validation.validate_email("a b@localhost", "to")


def test_new_settings_parse_and_refuse_bad_values() -> None:
    env = {
        "TIDINGS_REDIS_URL": "redis://127.0.0.1:1/0",
        "TIDINGS_KEY": KEY,
        "TIDINGS_AFTER_COMMIT": "yes",
        "TIDINGS_MISSING_MODELS": "skip",
        "TIDINGS_MAIL_ALLOW_TEST_DOMAINS": "0",
    }
    s = Settings.resolve({}, env)
    assert (s.after_commit, s.missing_models, s.mail_allow_test_domains) == (True, "skip", False)
    assert Settings.resolve({"after_commit": False}, env).after_commit is False
    with pytest.raises(ConfigurationError, match="TIDINGS_MISSING_MODELS must be"):
        Settings.resolve({}, {**env, "TIDINGS_MISSING_MODELS": "ignore"})


def test_allowed_module_errors_name_the_setting(redis_url: str, prefix: str) -> None:
    from tidings.errors import PayloadRejected

    app = App(redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=["tests"])
    with pytest.raises(PayloadRejected, match="TIDINGS_ALLOWED_MODULES"):
        app.resolve_class("accounts.events:UserRegistered")
    app.close()


def test_aclose_is_safe_without_clients(redis_url: str, prefix: str) -> None:
    app = App(redis_url=redis_url, key=KEY, prefix=prefix)
    asyncio.run(app.aclose())
