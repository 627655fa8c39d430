"""vLLM's engine processes started from a fork server that has vLLM imported, for the tests only.

On CPU vLLM starts each engine's core process with `spawn` (its CPU platform forces it): a fresh
interpreter that imports vLLM, torch and transformers again, about 9 s of CPU before the engine
does anything, and the suite builds engines about a hundred times on two cores. Here those
processes are forked instead from one server process per test worker that imported those
modules once (Python's `forkserver` start method, which pickles the process as `spawn` does, so
what crosses to the engine is the same). Each engine process then runs with the environment of
the process that started it, as a spawned one would (a fork server's children would otherwise
keep the server's), and the server is started at the first build, after vLLM has set the
variables it wants its engine processes to start with (`LD_PRELOAD` of tcmalloc among them).
An engine process also reads and writes subnormal numbers as zero: with random weights the
towers of a few twins (Gemma 3n's MobileNet-V5, whole-size) computed on them about 50 times slower.

The engine's own code is unchanged (its arithmetic too, but for subnormal numbers); the app's
real start (`spawn`) stays covered by the tests that run `python -m app` in a process of its own
(test_shutdown, the grid's command line), which this does not reach.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.context import ForkServerContext, ForkServerProcess
from typing import Any

# What an engine core process imports on its way to serving a model (found with `python -X
# importtime`); a module missing here is imported by the engine process itself, only slower.
PRELOAD = [
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.model_executor.model_loader",
    "vllm.multimodal.processing",
    "transformers",
]


class EnvironmentKeepingProcess(ForkServerProcess):
    """A process forked by the fork server that runs in its starter's environment, as a spawned
    one does."""

    def start(self) -> None:
        self._starter_environment = dict(os.environ)
        super().start()

    def run(self) -> None:
        os.environ.clear()
        os.environ.update(self._starter_environment)
        # Subnormal numbers read and written as zero: vLLM's random weights (about 1e-3) shrink
        # a deep tower's activations below float32's normal range, where a CPU computes some 50
        # times slower (tests/test_engine_processes.py). The threads the engine starts inherit it.
        import torch

        torch.set_flush_denormal(True)
        super().run()


class EnvironmentKeepingContext(ForkServerContext):
    Process = EnvironmentKeepingProcess  # type: ignore[assignment]


CONTEXT = EnvironmentKeepingContext()


def preloaded_mp_context(*_: Any) -> EnvironmentKeepingContext:
    return CONTEXT


def start_engines_from_a_preloaded_server() -> None:
    """Makes vLLM start its engine core processes from the fork server (call before any build)."""
    import vllm.v1.engine.utils as engine_utils

    multiprocessing.set_forkserver_preload(PRELOAD)
    engine_utils.get_mp_context = preloaded_mp_context
