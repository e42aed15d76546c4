"""SSRF guard without sockets: URL vetting, address policy, one lookup, pinning (B14, B15, F21)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable

import httpcore
import pytest

from tidings.errors import PermanentChannelError, TransientChannelError, ValidationError
from tidings.notifications.net import (
    SystemResolver,
    Target,
    _PinnedBackend,
    check_url,
    dns_error,
    is_forbidden_ip,
    pinned,
    resolve_target,
)

INTERNAL_URLS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://127.0.0.1:8080/",
    "http://[::1]/",
    "http://0.0.0.0/",
    "http://10.0.0.1/",
    "http://172.16.5.4/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",
    "http://224.0.0.1/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:7f00:1]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[2002:a9fe:a9fe::1]/",
    "http://[fd00:ec2::254]/",
    "http://[fe80::1]/",
    "http://2852039166/",
    "http://0xa9.0xfe.0xa9.0xfe/",
    "http://0251.0376.0251.0376/",
    "http://0x7f.1/",
    "http://127.1/",
    "http://localhost/",
    "http://api.localhost/",
]

MALFORMED_URLS = [
    "file:///etc/passwd",
    "gopher://example.org/_x",
    "ftp://example.org/",
    "http://user:pw@example.org/",
    "http://user@example.org/",
    "http://example.org:6379/",
    "http://example.org:11211/",
    "http://example.org:99999/",
    "http://example.org\\@127.0.0.1/",
    "http://exa mple.org/",
    "http://example.org/\r\nX: y",
    "http://[fe80::1%25eth0]/",
    "http://1.2.3/",
    "",
    "http:///path",
]


@pytest.mark.parametrize("url", INTERNAL_URLS + MALFORMED_URLS)
def test_check_url_refuses(url: str) -> None:
    with pytest.raises(ValidationError) as info:
        check_url(url, allow_private=False)
    assert info.value.field == "url"


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("https://example.org/hook", "example.org", 443),
        ("http://Example.ORG:8080/x?y=1", "example.org", 8080),
        ("https://bücher.de/", "xn--bcher-kva.de", 443),
        ("http://8.8.8.8/", "8.8.8.8", 80),
        ("https://[2606:4700::1111]:8443/", "2606:4700::1111", 8443),
    ],
)
def test_check_url_accepts_public(url: str, host: str, port: int) -> None:
    target = check_url(url, allow_private=False)
    assert (target.host, target.port) == (host, port)


def test_allow_private_lifts_address_checks_only() -> None:
    assert check_url("http://127.0.0.1:8080/", allow_private=True).ip == ipaddress.ip_address(
        "127.0.0.1"
    )
    assert check_url("http://localhost:9/", allow_private=True).host == "localhost"
    for url in ("http://127.0.0.1:6379/", "file:///etc/passwd", "http://u:p@127.0.0.1/"):
        with pytest.raises(ValidationError):
            check_url(url, allow_private=True)


@pytest.mark.parametrize(
    "ip",
    [
        "127.0.0.1", "10.1.2.3", "172.31.255.255", "192.168.0.1", "169.254.169.254",
        "100.64.0.1", "100.127.255.254", "0.0.0.0", "255.255.255.255", "224.0.0.251",
        "240.0.0.1", "192.0.2.1", "198.18.0.1", "::", "::1", "fe80::1", "fc00::1",
        "fd00:ec2::254", "ff02::1", "::ffff:10.0.0.1", "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", "2002:a9fe:a9fe::1", "2002:7f00:1::",
        "2001:db8::1", "fec0::1", "2001::1", "::127.0.0.1", "not-an-ip",
    ],
)  # fmt: skip
def test_forbidden_ips(ip: str) -> None:
    assert is_forbidden_ip(ip)


@pytest.mark.parametrize(
    "ip",
    ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8", "2002:808:808::1"],
)
def test_public_ips(ip: str) -> None:
    assert not is_forbidden_ip(ip)
    assert not is_forbidden_ip(ipaddress.ip_address(ip))


class FakeResolver:
    """Answers from a list of per-call answers (or raises); records every call."""

    def __init__(self, *answers: list[str] | BaseException) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, int]] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def resolve(target: Target, resolver: FakeResolver, allow_private: bool = False) -> str:
    return asyncio.run(resolve_target(target, resolver, allow_private=allow_private))


def test_resolves_once_and_returns_first_answer() -> None:
    resolver = FakeResolver(["93.184.216.34", "93.184.216.35"], ["127.0.0.1"])
    assert resolve(check_url("https://example.org/", False), resolver) == "93.184.216.34"
    assert resolver.calls == [("example.org", 443)]


@pytest.mark.parametrize("answers", [["169.254.169.254"], ["93.184.216.34", "10.0.0.5"], ["::1"]])
def test_any_forbidden_answer_refuses_the_target(answers: list[str]) -> None:
    with pytest.raises(ValidationError, match="resolves to"):
        resolve(check_url("https://metadata.example.org/", False), FakeResolver(answers))


def test_private_answers_allowed_when_private_is_allowed() -> None:
    target = check_url("http://svc.example.org:8080/", False)
    assert resolve(target, FakeResolver(["10.0.0.5"]), allow_private=True) == "10.0.0.5"


def test_ip_literals_skip_the_resolver() -> None:
    resolver = FakeResolver(["10.0.0.1"])
    assert resolve(check_url("http://8.8.8.8/", False), resolver) == "8.8.8.8"
    assert resolver.calls == []


def test_dns_errors_are_classified() -> None:
    target = check_url("https://example.org/", False)
    again = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    with pytest.raises(TransientChannelError) as transient:
        resolve(target, FakeResolver(again))
    assert transient.value.channel == "webhook"
    nxdomain = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    with pytest.raises(PermanentChannelError):
        resolve(target, FakeResolver(nxdomain))
    with pytest.raises(PermanentChannelError, match="no addresses"):
        resolve(target, FakeResolver([]))
    with pytest.raises(ValidationError):
        resolve(target, FakeResolver(["not-an-ip"]))
    assert isinstance(dns_error(nxdomain, "x", nxdomain_permanent=False), TransientChannelError)


def test_system_resolver_translates_gaierror(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fail(*args: object, **kwargs: object) -> list[object]:
        raise socket.gaierror(socket.EAI_AGAIN, "try again")

    async def run() -> None:
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(loop, "getaddrinfo", fail)
        await SystemResolver().resolve("example.org", 443)

    with pytest.raises(TransientChannelError, match="temporary DNS failure"):
        asyncio.run(run())


class RecordingBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self.connects: list[tuple[str, int]] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.connects.append((host, port))
        raise httpcore.ConnectError("recorded, not connected")

    async def sleep(self, seconds: float) -> None:
        return None


def test_pinned_backend_connects_only_to_pinned_addresses() -> None:
    inner = RecordingBackend()
    backend = _PinnedBackend(inner)

    async def run() -> None:
        with pytest.raises(httpcore.ConnectError, match="no vetted address"):
            await backend.connect_tcp("example.org", 443)
        with pinned("Example.org", 443, "93.184.216.34"):
            with pytest.raises(httpcore.ConnectError, match="recorded"):
                await backend.connect_tcp("example.org", 443)
            with pytest.raises(httpcore.ConnectError, match="no vetted address"):
                await backend.connect_tcp("example.org", 8443)  # other port: no pin
        with pytest.raises(httpcore.ConnectError, match="no vetted address"):
            await backend.connect_tcp("example.org", 443)  # pin ended with the block
        with pytest.raises(httpcore.ConnectError):
            await backend.connect_unix_socket("/var/run/docker.sock")

    asyncio.run(run())
    assert inner.connects == [("93.184.216.34", 443)]
