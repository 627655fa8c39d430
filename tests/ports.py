"""A free TCP port on loopback, for the servers the tests start."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Where the ports come from: outside the kernel's ephemeral range, below it as a rule. A port the
# kernel hands out (to a bind to port 0, or as the local end of an outgoing connection: the other
# test worker's clients, vLLM's own ports) can be taken again by anyone between this check and the
# server's bind; a clean clone's app once failed to start so ("Cannot find empty port"), its port
# 41549 taken meanwhile. Outside that range only another pick like this one can take it: one in
# thousands.
LOWEST = 20_000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999


def free_port() -> int:
    """A loopback port no one holds now, drawn at random outside the ephemeral range: below it, or
    above it where a machine's range reaches down near `LOWEST`."""
    low, high = ephemeral_range()
    window = (LOWEST, low) if low - LOWEST >= 1_000 else (high + 1, 65_536)
    if window[1] - window[0] < 1_000:  # the range covers nearly every port: take the kernel's pick
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]
    picker = random.SystemRandom()  # not the tests' seeded generator: workers must not draw alike
    for _ in range(200):
        port = picker.randrange(*window)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port from {window[0]} to {window[1] - 1}")
