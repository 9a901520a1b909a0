"""Where an alert webhook may point: public addresses only, so that a rule cannot turn the console into a client of
services that trust its network position (a Redis on loopback, a cloud metadata service, an internal admin page).

A host the operator names in MODELGRID_WEBHOOK_ALLOWED_HOSTS (an in-cluster Alertmanager) is exempt. A target is
checked when a rule is saved, to refuse it with a reason, and again when a delivery is sent, on the addresses the
connection is made to: `PublicResolver` resolves a name once and hands aiohttp only the addresses it checked, so a
name that resolves elsewhere by then (DNS rebinding) reaches nothing it should not."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from django.conf import settings

ALLOW_HINT = "webhooks go to public addresses only (an operator may allow a host with MODELGRID_WEBHOOK_ALLOWED_HOSTS)"


class RefusedTarget(OSError):
    """A webhook's target is not one the console may reach; the message says why."""


def address_kind(address: str) -> str | None:
    """What makes `address` (an IP address as text) no webhook target ("a loopback address"), or None: public."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) names no other address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is connected to as 127.0.0.1
    for kind, yes in (("a loopback", ip.is_loopback), ("a link-local", ip.is_link_local),
                      ("an unspecified", ip.is_unspecified), ("a multicast", ip.is_multicast),
                      ("a private", ip.is_private), ("a reserved", ip.is_reserved)):
        if yes:
            return f"{kind} address"
    if not ip.is_global:  # shared address space (100.64.0.0/10) and the like
        return "not a public address"
    return None


def allowed(host: str) -> bool:
    """Whether the operator allowed `host` (a name or an address, as the URL writes it) whatever it resolves to."""
    return host.lower().strip("[]").rstrip(".") in settings.MODELGRID_WEBHOOK_ALLOWED_HOSTS


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def literal_refusal(host: str) -> str | None:
    """Why a host written as an address may not be reached (aiohttp connects to an address without resolving it, so
    these are checked before sending); None for a name, an allowed host or a public address."""
    if allowed(host) or _literal(host) is None:
        return None
    address = host.strip("[]")
    kind = address_kind(address)
    return f"{address} is {kind}: {ALLOW_HINT}" if kind else None


def url_refusal(url: str) -> str | None:
    """Why `url` may not be a webhook (sync: resolves its host name), or None. A name that does not resolve now is
    let through: the delivery checks again when it is sent, and fails with its own reason then."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError as e:  # an unbalanced "[" in its host: "Invalid IPv6 URL"
        return f"{url!r} is not a URL ({e})"
    if not host:
        return f"{url!r} names no host"
    if allowed(host):
        return None
    if _literal(host) is not None:
        return literal_refusal(host)
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return _resolved_refusal(host, [sockaddr[0] for *_, sockaddr in found])


def _resolved_refusal(host: str, addresses: list[str]) -> str | None:
    for address in addresses:
        kind = address_kind(address)
        if kind:
            return f"{host} resolves to {address}, {kind}: {ALLOW_HINT}"
    return None


class PublicResolver(AbstractResolver):
    """aiohttp's resolver, returning a name's addresses only when none of them is refused: the addresses checked are
    the ones connected to. A name that resolves to any refused address is refused whole."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        why = None if allowed(host) else _resolved_refusal(host, [result["host"] for result in found])
        if why:
            raise RefusedTarget(why)
        return found

    async def close(self) -> None:
        await self._inner.close()
