"""SSRF guard for outbound webhooks: vet the URL, resolve once, connect to what was vetted.

A webhook URL is user data, so three things happen before any socket opens:

1. :func:`check_url` refuses anything but ``http``/``https``, userinfo, well-known
   internal service ports, and literal addresses in forbidden ranges — including the
   numeric IPv4 spellings browsers and ``inet_aton`` accept (``2852039166``,
   ``0xa9.0xfe.0xa9.0xfe``, ``0251.0376.0251.0376`` all mean 169.254.169.254).
2. :func:`resolve_target` asks the injectable :class:`Resolver` once and refuses the
   delivery if *any* answer is forbidden (:func:`is_forbidden_ip`).
3. The request runs inside :func:`pinned`, and :class:`PinnedTransport` makes httpx
   connect to that vetted IP instead of resolving the name again — so a DNS answer
   that changes between check and connect (rebinding) cannot redirect it. The URL,
   ``Host`` header, TLS SNI and certificate check all keep the original host name,
   because only the TCP connect is redirected. A connect for a host with no pin is
   refused outright, so nothing can reach the network around the guard.

``allow_private=True`` (tests, local development) lifts the address-range checks but
keeps the single resolution and the pinning.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import unicodedata
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

import httpcore
import httpx

from tidings.errors import (
    ChannelError,
    PermanentChannelError,
    TransientChannelError,
    ValidationError,
)

__all__ = [
    "BLOCKED_PORTS",
    "PinnedTransport",
    "Resolver",
    "SystemResolver",
    "Target",
    "check_url",
    "dns_error",
    "is_forbidden_ip",
    "pinned",
    "resolve_target",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Ports of internal services that speak line protocols an HTTP body can smuggle
#: commands into (Redis, memcached, SMTP, databases, Docker and etcd APIs).
BLOCKED_PORTS = frozenset(
    {19, 21, 22, 23, 25, 110, 111, 135, 139, 143, 445, 465, 587, 993, 995, 2049, 2375,
     2376, 2379, 2380, 3306, 5432, 5984, 6379, 6380, 9200, 9300, 11211, 27017}
)  # fmt: skip

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_EXTRA_FORBIDDEN: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = (
    ipaddress.IPv4Network("100.64.0.0/10"),  # CGNAT, not "private" to the stdlib
    ipaddress.IPv4Network("0.0.0.0/8"),
    ipaddress.IPv4Network("192.0.0.0/24"),
    ipaddress.IPv4Network("198.18.0.0/15"),
    ipaddress.IPv6Network("::/96"),  # deprecated IPv4-compatible addresses
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # local-use NAT64
    ipaddress.IPv6Network("2001::/32"),  # Teredo: the client address is obfuscated
    ipaddress.IPv6Network("fc00::/7"),  # unique local, fd00::/8 included
    ipaddress.IPv6Network("fec0::/10"),  # deprecated site-local
)


class Resolver(Protocol):
    """Turns a host name into the IP addresses to try; injectable for tests."""

    async def resolve(self, host: str, port: int) -> list[str]:
        """Return the IP addresses of ``host`` as strings, best first."""
        ...


def dns_error(
    exc: socket.gaierror, host: str, *, channel: str = "", nxdomain_permanent: bool = True
) -> ChannelError:
    """Classify a resolver failure: temporary (``EAI_AGAIN``) or not (``EAI_NONAME``).

    Args:
        exc: the ``socket.gaierror`` from ``getaddrinfo`` (or a fake resolver).
        host: the name that failed, for the message.
        channel: channel name to put on the error.
        nxdomain_permanent: treat "no such name" as permanent (the default) rather
            than retrying it like a temporary failure.
    """
    permanent_codes = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}
    if exc.errno in permanent_codes and nxdomain_permanent:
        return PermanentChannelError(f"cannot resolve {host}: no such host", channel=channel)
    return TransientChannelError(
        f"cannot resolve {host}: temporary DNS failure ({exc.strerror or exc.errno})",
        channel=channel,
    )


class SystemResolver:
    """Resolves with the event loop's ``getaddrinfo`` (the system resolver)."""

    def __init__(self, *, nxdomain_permanent: bool = True) -> None:
        """Create a resolver.

        Args:
            nxdomain_permanent: whether ``EAI_NONAME`` fails delivery for good.
        """
        self._nxdomain_permanent = nxdomain_permanent

    async def resolve(self, host: str, port: int) -> list[str]:
        """Return the unique addresses of ``host``, in the resolver's order.

        Raises:
            TransientChannelError: temporary DNS failure.
            PermanentChannelError: the name does not exist.
        """
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except socket.gaierror as exc:
            raise dns_error(exc, host, nxdomain_permanent=self._nxdomain_permanent) from None
        return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True, slots=True)
class Target:
    """A URL that passed :func:`check_url`.

    Attributes:
        url: the URL as given.
        scheme: ``http`` or ``https``.
        host: the host as httpx will present it to the network layer (IDNA ASCII,
            IPv6 without brackets); the key :func:`pinned` uses.
        port: explicit or default port.
        ip: the address when the host is an IP literal (in any spelling), else None.
    """

    url: str
    scheme: str
    host: str
    port: int
    ip: IPAddress | None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_forbidden_ip(ip: IPAddress | str) -> bool:
    """Whether a webhook may not connect to ``ip``.

    Refused: private, loopback, link-local, CGNAT (100.64/10), multicast,
    unspecified, reserved and documentation ranges, unique-local IPv6, and IPv6
    addresses that embed a forbidden IPv4 address (``::ffff:``, NAT64 ``64:ff9b::/96``,
    6to4 ``2002::/16``). An unparsable string is refused too.
    """
    if isinstance(ip, str):
        try:
            ip = ipaddress.ip_address(ip.split("%", 1)[0])
        except ValueError:
            return True
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            return is_forbidden_ip(embedded)
    if (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
        or not ip.is_global
    ):
        return True
    return any(ip.version == net.version and ip in net for net in _EXTRA_FORBIDDEN)


def _parse_ip_host(host: str) -> IPAddress | None:
    """Parse an IP literal, accepting every IPv4 spelling ``inet_aton`` does."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            raise ValidationError("invalid IPv6 address", field="url") from None
    last = host.rstrip(".").rsplit(".", 1)[-1].lower()
    # WHATWG URL rule: a host whose last label is a number is an IPv4 address,
    # whatever base its parts are written in; never hand it to DNS as a name.
    is_hex = last.startswith("0x") and all(c in "0123456789abcdef" for c in last[2:])
    if last.isdigit() or is_hex:
        if not host.isascii():
            raise ValidationError("invalid IPv4 address", field="url")
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host.rstrip(".")))
        except OSError:
            raise ValidationError("invalid IPv4 address", field="url") from None
    return None


def check_url(url: str, allow_private: bool) -> Target:
    """Vet a webhook URL without touching the network.

    Args:
        url: the target URL.
        allow_private: accept private, loopback and link-local literal addresses.

    Returns:
        The parsed :class:`Target`.

    Raises:
        ValidationError: (field ``url``) bad scheme, userinfo, blocked port,
            forbidden address or malformed URL.
    """
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise ValidationError("URL must be a non-empty string of at most 2048 chars", field="url")
    if any(unicodedata.category(c)[0] in "CZ" or c == "\\" for c in url):
        raise ValidationError("URL contains whitespace, control or backslash chars", field="url")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValidationError("only http and https URLs are allowed", field="url")
    if "@" in parts.netloc:
        raise ValidationError("credentials in the URL are not allowed", field="url")
    raw_host = (parts.hostname or "").rstrip(".")
    if not raw_host:
        raise ValidationError("URL has no host", field="url")
    if "%" in raw_host:
        raise ValidationError("IPv6 zone identifiers are not allowed", field="url")
    ip = _parse_ip_host(raw_host)
    if ip is not None and not allow_private and is_forbidden_ip(ip):
        raise ValidationError(f"address {ip} is not allowed for webhooks", field="url")
    if isinstance(ip, ipaddress.IPv4Address) and str(ip) != raw_host:
        raise ValidationError(f"non-canonical IPv4 address (means {ip})", field="url")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        raise ValidationError("malformed URL", field="url") from None
    host = parsed.raw_host.decode("ascii").lower().rstrip(".")
    port = parsed.port if parsed.port is not None else (443 if scheme == "https" else 80)
    if not 0 < port < 65536:
        raise ValidationError("port out of range", field="url")
    if port in BLOCKED_PORTS:
        raise ValidationError(f"port {port} is not allowed for webhooks", field="url")
    local_name = host == "localhost" or host.endswith((".localhost", ".local"))
    if ip is None and local_name and not allow_private:
        raise ValidationError(f"host {host} is not allowed for webhooks", field="url")
    return Target(url=url, scheme=scheme, host=host, port=port, ip=ip)


async def resolve_target(
    target: Target,
    resolver: Resolver,
    *,
    allow_private: bool,
    channel: str = "webhook",
    timeout_s: float = 5.0,
) -> str:
    """Resolve ``target`` once, vet every answer, and return the address to pin.

    Raises:
        ValidationError: an answer is a forbidden address (the whole target is
            refused, not just that answer, since an attacker controls the order).
        TransientChannelError: temporary DNS failure or timeout.
        PermanentChannelError: the name does not exist or has no address.
    """
    if target.ip is not None:
        return str(target.ip)
    try:
        async with asyncio.timeout(timeout_s):
            answers = await resolver.resolve(target.host, target.port)
    except socket.gaierror as exc:
        raise dns_error(exc, target.host, channel=channel) from None
    except TimeoutError:
        raise TransientChannelError(
            f"DNS lookup of {target.host} timed out", channel=channel
        ) from None
    except ChannelError as exc:
        exc.channel = exc.channel or channel
        raise
    addresses: list[IPAddress] = []
    for answer in answers:
        try:
            addresses.append(ipaddress.ip_address(answer.split("%", 1)[0]))
        except ValueError:
            raise ValidationError(
                f"resolver returned a non-IP answer for {target.host}", field="url"
            ) from None
    if not addresses:
        raise PermanentChannelError(f"{target.host} has no addresses", channel=channel)
    if not allow_private:
        for address in addresses:
            if is_forbidden_ip(address):
                raise ValidationError(
                    f"{target.host} resolves to {address}, which is not allowed", field="url"
                )
    return str(addresses[0])


_PINS: ContextVar[Mapping[tuple[str, int], str] | None] = ContextVar("tidings_pins", default=None)


@contextmanager
def pinned(host: str, port: int, ip: str) -> Iterator[None]:
    """Within this block, a :class:`PinnedTransport` connects ``host:port`` to ``ip``."""
    current = _PINS.get() or {}
    token = _PINS.set({**current, (host.lower(), port): ip})
    try:
        yield
    finally:
        _PINS.reset(token)


class _PinnedBackend(httpcore.AsyncNetworkBackend):
    """Network backend that only opens TCP connections to pinned addresses."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        ip = (_PINS.get() or {}).get((host.lower(), port))
        if ip is None:
            raise httpcore.ConnectError(f"no vetted address for {host}:{port}; not connecting")
        return await self._inner.connect_tcp(
            ip, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not allowed")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """An httpx transport whose every TCP connect goes to the address set by :func:`pinned`.

    Pooled keep-alive connections are keyed by scheme, host name and port, so a
    reused connection was itself opened to an address vetted for that host.
    """

    def __init__(
        self, *, verify: ssl.SSLContext | bool = True, limits: httpx.Limits | None = None
    ) -> None:
        """Create the transport.

        Args:
            verify: TLS verification (an ``SSLContext`` to trust a private CA).
            limits: connection-pool limits.
        """
        limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
        super().__init__(verify=verify, trust_env=False, limits=limits, retries=0)
        # httpx has no public hook for the network backend, so replace its pool with
        # one built the same way but with our backend; only connect_tcp differs.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            retries=0,
            network_backend=_PinnedBackend(httpcore.AnyIOBackend()),
        )


async def read_capped(response: httpx.Response, cap: int, chunks: list[bytes]) -> None:
    """Read at most ``cap`` bytes of a reply into ``chunks`` (filled as they arrive, so
    what came before a timeout is kept); the rest is never read."""
    remaining = cap
    async for chunk in response.aiter_raw():
        chunks.append(chunk[:remaining])
        remaining -= len(chunks[-1])
        if remaining <= 0:
            break
