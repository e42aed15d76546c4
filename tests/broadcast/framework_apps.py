"""The broadcast endpoint mounted in a Starlette app and in Django's ASGI application
(run by uvicorn in test_broadcast_frameworks.py)."""

from __future__ import annotations

from typing import Any

from tests.broadcast.bc_app import app as tidings_app
from tidings.broadcasting.sse import broadcast_app, mount


def _starlette() -> Any:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    async def home(request: Any) -> PlainTextResponse:
        return PlainTextResponse("starlette home")

    return Starlette(routes=[Route("/", home), Mount("/events", broadcast_app(tidings_app))])


def _django() -> Any:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="broadcast-test-secret-key-0123456789",
            ALLOWED_HOSTS=["127.0.0.1", "localhost"],
            ROOT_URLCONF=__name__,
            INSTALLED_APPS=[],
            MIDDLEWARE=[],
        )
        django.setup()
    from django.core.asgi import get_asgi_application

    return mount(get_asgi_application(), broadcast_app(tidings_app), "/broadcast")


def _home(request: Any) -> Any:
    from django.http import HttpResponse

    return HttpResponse("django home")


def __getattr__(name: str) -> Any:
    # urlpatterns for ROOT_URLCONF, built on first use (Django imports it lazily)
    if name == "urlpatterns":
        from django.urls import path

        return [path("", _home)]
    raise AttributeError(name)


starlette_app = _starlette()
django_app = _django()
