"""A port picked for a server that starts later (a worker's metrics port, a local stack's) is not
one the kernel hands to outgoing connections: in the suite a worker's metrics port, picked with
bind(0) and started on 30 s later, was by then a client connection's own port (EADDRINUSE)."""

from __future__ import annotations

import socket

from efo.devstack.stack import LOOPBACK, ephemeral_ports, free_port


def test_a_free_port_is_outside_the_range_of_outgoing_connections_and_free() -> None:
    low, high = ephemeral_ports()
    for _ in range(200):
        port = free_port()
        assert not low <= port <= high, f"{port} is in the ephemeral range {low}-{high}"
        assert 1024 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, free_port()))


def test_the_ephemeral_range_is_the_kernel_s() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        low, high = (int(n) for n in ports.read().split())
    assert ephemeral_ports() == (low, high)
