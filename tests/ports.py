"""A free TCP port on the loopback, for a server a test or a benchmark starts in another process."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])
