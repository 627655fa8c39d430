"""A free TCP port on loopback, for the servers the tests start."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Where the ports come from: below the kernel's ephemeral range. A port the kernel hands out (to a
# bind to port 0, or as the local end of an outgoing connection: the other test worker's clients,
# vLLM's own ports) can be taken again by anyone between this check and the server's bind; a clean
# clone's app once failed to start so ("Cannot find empty port"), its port 41549 taken meanwhile.
# Below that range only another pick like this one can take it: one in thousands.
LOWEST = 20_000


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A loopback port no one holds now, drawn at random below the ephemeral range."""
    picker = random.SystemRandom()  # not the tests' seeded generator: workers must not draw alike
    highest = max(ephemeral_start(), LOWEST + 1_000)
    for _ in range(200):
        port = picker.randrange(LOWEST, highest)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {LOWEST} and {highest}")
