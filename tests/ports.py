"""A free TCP port on the loopback, for a server a test or a benchmark starts in another process."""

from __future__ import annotations

import socket


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each socket is held until all are chosen (one closed
    before the next is asked for may give the same port again)."""
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    try:
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
