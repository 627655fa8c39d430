"""One vLLM engine as the phases use it: built with the check's arguments (dummy weights, sleep
mode on), asked one request with a picture, put to sleep and woken, and shut down as the app
shuts its engines down, waiting for its processes and its GPU memory.

Every phase goes through these, so that each measures the same operations.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.engines.vllm_engine import engine_process_ids, wait_for_exit

from . import common
from .common import IMAGE_SIDE, MAX_MODEL_LEN, MAX_NUM_SEQS, PROMPT, gib
from .machine import gpu_used, wait_for_memory

if TYPE_CHECKING:
    from .phase import Model

# Numbers the requests (their ids, and the seed of each one's picture) across all phases.
request_ids = itertools.count()
# Set when a build timed out while its thread goes on: the command then exits without waiting.
leaked = threading.Event()


def engine_args(
    folder: Path, util: float, kv_bytes: int | None = None, load_format: str = "dummy"
) -> dict[str, Any]:
    """The check's engine arguments; `kv_bytes`: the KV cache in bytes, as the app gives it
    (vLLM then uses `util` only to check that this much of the GPU is free at the build)."""
    args = {
        "model": str(folder),
        "load_format": load_format,
        "dtype": common.DTYPE,
        "mm_processor_kwargs": dict(common.PIXELS),
        "enforce_eager": False,
        "enable_sleep_mode": True,
        "gpu_memory_utilization": util,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": MAX_NUM_SEQS,
        "limit_mm_per_prompt": {"image": 1},
    }
    if kv_bytes is not None:
        args["kv_cache_memory_bytes"] = kv_bytes
    args.update(common.ENGINE_OVERRIDES)
    return args


async def build(model: Model, util: float | None = None) -> Any:
    """The role's engine, with its KV cache in bytes and `util` (default: the model's share)."""
    args = engine_args(
        model.folder, util if util is not None else model.util, model.spec.kv_reserve_bytes, model.load_format
    )

    def start() -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))

    task = asyncio.ensure_future(asyncio.to_thread(start))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        # Timed out: the thread goes on; the engine it may still return is shut down then.
        leaked.set()
        task.add_done_callback(_shutdown_late)
        raise


def _shutdown_late(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is None:
        with contextlib.suppress(Exception):
            task.result().shutdown()


def picture(seed: int) -> Any:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


async def answer(engine: Any, tokens: int) -> dict[str, Any]:
    """One request with a picture, greedy, exactly `tokens` tokens; timings and token ids."""
    from vllm import SamplingParams

    number = next(request_ids)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0)
    prompt = {"prompt": PROMPT, "multi_modal_data": {"image": picture(number)}}
    start = time.perf_counter()
    first = final = None
    async for output in engine.generate(prompt, params, f"gpu-check-{number}"):
        first = first or time.perf_counter()
        final = output
    if final is None or not final.finished:
        raise RuntimeError("the request ended without a finished output")
    completion = final.outputs[0]
    if len(completion.token_ids) != tokens:
        raise RuntimeError(f"{len(completion.token_ids)} tokens generated, {tokens} asked")
    return {
        "first_output_s": round((first or start) - start, 3),
        "tokens": len(completion.token_ids),
        "_token_ids": list(completion.token_ids),
    }


async def stop(engine: Any, memory_target: int | None) -> dict[str, Any]:
    """Shuts the engine down as the app does, then waits for its processes and its GPU memory."""
    pids = engine_process_ids(engine)
    handler = getattr(engine, "output_handler", None)
    if handler is not None:
        handler.cancel()
    start = time.perf_counter()
    await asyncio.to_thread(engine.shutdown)
    # The app's own wait, with the check's longer timeout (a first build on a GPU is slow to end).
    killed = await asyncio.to_thread(wait_for_exit, pids, 60.0)
    result: dict[str, Any] = {"processes_gone_s": round(time.perf_counter() - start, 2)}
    if killed:
        result["processes_killed"] = killed
    result.update(await asyncio.to_thread(wait_for_memory, memory_target))
    return result


async def sleep(engine: Any) -> dict[str, Any]:
    before = gpu_used()
    await engine.sleep(level=1)
    after = gpu_used()
    freed = None if before is None or after is None else before - after
    return {"is_sleeping": await engine.is_sleeping(), "freed_gib": gib(freed), "_freed": freed}


async def wake(engine: Any) -> dict[str, Any]:
    before = gpu_used()
    fully_awake = await engine.wake_up()
    after = gpu_used()
    taken = None if before is None or after is None else after - before
    return {"fully_awake": fully_awake, "is_sleeping": await engine.is_sleeping(), "taken_gib": gib(taken)}
