"""The SSRF guard of image URLs: which hosts `vision.allowed_domains` lets a URL name, and which
addresses a fetch may connect to (public ones only: never private, loopback, link-local,
multicast, reserved or unspecified, an IPv4 address inside an IPv6 one included). The fetch then
connects to the addresses checked here, never to a second resolution of the name (fetch.py)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Sequence

from rillet.core.vision.image import ImageError, ImageErrorKind

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
AddressCheck = Callable[[IpAddress], bool]
# NAT64's well-known prefix (RFC 6052): its last 32 bits are an IPv4 address a gateway reaches.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def host_allowed(host: str, patterns: Sequence[str]) -> bool:
    """`host` (lower-case, as a URL carries it) against `example.com`, `*.example.com`, `*`."""
    host = host.rstrip(".")
    for pattern in patterns:
        p = pattern.lower().rstrip(".")
        if p == "*" or host == p or (p.startswith("*.") and host.endswith(p[1:])):
            return True
    return False


def is_public(ip: IpAddress) -> bool:
    """A global unicast address; one that embeds an IPv4 address is judged by that address too."""
    if not _plainly_public(ip):
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        inner = [ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None]
        if ip in _NAT64:
            inner.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        return all(v4 is None or _plainly_public(v4) for v4 in inner)
    return True


def _plainly_public(ip: IpAddress) -> bool:
    special = (
        ip.is_private,
        ip.is_loopback,
        ip.is_link_local,
        ip.is_multicast,
        ip.is_reserved,
        ip.is_unspecified,
    )
    return ip.is_global and not any(special)


async def resolve_checked(host: str, port: int, part: str, check: AddressCheck) -> list[str]:
    """The host's addresses, every one passing `check` (else FORBIDDEN: a name that also resolves to
    a private address is refused, whichever address a connection would have used)."""
    literal = _literal(host)
    if literal is not None:
        addresses = [literal]
    else:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as e:
            raise ImageError(ImageErrorKind.FETCH_FAILED, part, f"cannot resolve the host {host!r}") from e
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addresses:
        raise ImageError(ImageErrorKind.FETCH_FAILED, part, f"the host {host!r} has no address")
    for ip in addresses:
        if not check(ip):
            msg = f"the host {host!r} resolves to {ip}, a private or reserved address"
            raise ImageError(ImageErrorKind.FORBIDDEN, part, msg)
    return list(dict.fromkeys(str(ip) for ip in addresses))


def _literal(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
