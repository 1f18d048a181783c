"""What a throttle counts a client by. One network's owner holds a whole IPv6 /64 (a host gets
one, and picks addresses inside it at will), so counting exact IPv6 addresses lets one client
rotate past any limit and fill the table that remembers them: the console's login throttle and
the API's bad-key throttle both count by `address_key`."""

from __future__ import annotations

import ipaddress

ADDRESS_CHARS = 64  # an address that is not an IP (a Unix socket's path) is cut to this


def address_key(host: str | None) -> str:
    """An IPv4 address as is (an IPv4-mapped IPv6 one as its IPv4), an IPv6 address as its
    /64, anything else (a socket path, a test client's name) cut to ADDRESS_CHARS."""
    if not host:
        return "?"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host[:ADDRESS_CHARS]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)
