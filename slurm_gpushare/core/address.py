"""``HOST:PORT`` network addresses, as the daemon listens on them and agents reach them."""

from __future__ import annotations


def parse_address(text: str, *, any_port: bool = False) -> tuple[str, int]:
    """``"10.0.0.1:6830"``, ``"ctl.example.org:6830"`` or ``"[::1]:6830"`` -> (host, port);
    ValueError with a short reason for anything else. ``any_port``: port 0 (a listener on a
    free port the system picks) is allowed."""
    if not isinstance(text, str) or ":" not in text:
        raise ValueError(f"{text!r} is not HOST:PORT")
    host, _, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c.isspace() for c in host) or (":" in host and "[" not in text):
        raise ValueError(f"{text!r} is not HOST:PORT (IPv6 addresses go in brackets)")
    if not port.isdigit() or not (0 if any_port else 1) <= int(port) < 65536:
        raise ValueError(f"{text!r}: the port must be 1 to 65535")
    return host, int(port)
