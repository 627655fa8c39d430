"""The suite's guard against a ZeroMQ context whose finalizer waits forever (`zmq_contexts`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# An engine client's shape: a plain context, an asyncio context shadowing it with an open socket,
# all in a reference cycle, then collected. Without the guard `gc.collect()` never returns.
CYCLE = """
import gc, sys, zmq, zmq.asyncio
sys.path.insert(0, sys.argv[1])
from zmq_contexts import keep_contexts_collected_open
keep_contexts_collected_open()
class Client: pass
client = Client()
client.sync_context = zmq.Context(io_threads=2)
client.context = zmq.asyncio.Context(client.sync_context)
client.socket = client.context.socket(zmq.PULL)
client.socket.bind("tcp://127.0.0.1:*")
client.itself = client
del client
gc.collect()
print("collected")
"""


def test_a_context_collected_with_its_shadows_socket_open_does_not_hang_the_process():
    tests = str(Path(__file__).resolve().parent)
    done = subprocess.run(
        [sys.executable, "-c", CYCLE, tests], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "collected", done.stderr[-2000:]
