"""This machine's own non-loopback address: a test binds a server on it and connects to it, so
the client sees a peer that is not loopback (the case the SMTP provider's credential rule is
about) without leaving the machine."""

from __future__ import annotations

import contextlib
import ipaddress
import socket


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine's own, not loopback, that a server can bind; None when
    there is none (the caller skips, saying so)."""
    candidates: list[str] = []
    for probe in ("192.0.2.1", "10.255.255.255", "8.8.8.8"):  # UDP: no packet is sent
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.connect((probe, 9))
                candidates.append(str(udp.getsockname()[0]))
        except OSError:
            continue
    with contextlib.suppress(OSError):
        candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    for candidate in candidates:
        address = ipaddress.ip_address(candidate)
        if address.is_loopback or address.is_unspecified:
            continue
        try:
            with socket.socket() as server:
                server.bind((candidate, 0))
        except OSError:
            continue
        return candidate
    return None
