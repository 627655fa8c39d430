"""A ZeroMQ context collected in a reference cycle must not hang the test process.

vLLM's async engine client makes a plain context and an asyncio context that shadows it, and its
sockets belong to the shadow. Where an engine's sockets were never closed (a close handed to an
event loop that did not run it again), the plain context is later collected by some unrelated
`gc.collect()` (hypothesis calls one before each property test). Its finalizer, `destroy`, sees
none of the shadow's sockets (the garbage cycle cleared its weak references first) and `term`
then waits for them forever: a worker of the suite sat in it for 20 minutes in a clean-clone run
(2026-12-03), in `tests/test_arena.py`'s first property test, and the run never ended.

In the tests' processes, a context still open when it is collected is kept instead (with its
I/O threads, until the process ends): the tests must end, and what the app does with its
engines is tested by its own shutdown tests."""

from __future__ import annotations

from typing import Any

KEPT: list[Any] = []


def keep_contexts_collected_open() -> None:
    import zmq

    if getattr(zmq.Context.__del__, "keeps_open", False):
        return
    finalize = zmq.Context.__del__

    def keep_open(self: Any) -> None:
        if not self.closed and not getattr(self, "_shadow", False):
            KEPT.append(self)  # resurrected: never finalized again (PEP 442)
            return
        finalize(self)

    keep_open.keeps_open = True  # type: ignore[attr-defined]
    zmq.Context.__del__ = keep_open  # type: ignore[method-assign]
