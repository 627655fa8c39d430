"""What the GPUs hold and which of them this process sees, through NVML (nvidia-ml-py, which
vLLM's CUDA build installs): the readings the engine factory sizes and measures engines with,
and the metrics report. Each answers None (or nothing) where NVML cannot, as on a CPU machine.

Checked on a real GPU by `bench/gpu_check --readings` against processes holding known amounts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from app.config import cuda_visible_entries

log = logging.getLogger(__name__)


def gpu_memory(kind: str, warn: bool = True) -> list[int] | None:
    """Every GPU's memory `used` or `total` in bytes, by NVML index; None where NVML fails (said
    in a warning unless `warn` is off: the metrics ask at every scrape)."""
    try:
        import pynvml
    except ImportError:
        return None  # no NVML installed: a CPU machine
    try:
        pynvml.nvmlInit()
        return [
            device_memory(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i), kind)
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    except Exception:
        if warn:
            log.warning("cannot read GPU memory through NVML")
        return None


def device_memory(pynvml: Any, handle: Any, kind: str) -> int:
    """One GPU's memory `used` or `total`, without what the driver reserves for itself: NVML's
    first call counts it in both (0.6 GiB on an H200, where CUDA's total is NVML's less exactly
    that, and an idle GPU showed 0.6 GiB used), its second call apart. Drivers without the second
    call give the first's figures."""
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except Exception:
        return int(getattr(pynvml.nvmlDeviceGetMemoryInfo(handle), kind))
    if kind == "total":
        return int(info.total) - int(info.reserved)
    return int(info.used)


def visible_devices(environ: Mapping[str, str] = os.environ) -> list[int] | None:
    """CUDA_VISIBLE_DEVICES as NVML indices (PCI bus order, which the factory makes CUDA use),
    read as CUDA reads it (`cuda_visible_entries`): numbers as they are, GPU UUIDs (or a prefix of
    one, as CUDA allows) looked up, up to an entry that names no one GPU; two entries naming the
    same GPU leave none. None where it is not set."""
    text = environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    entries = cuda_visible_entries(text, _gpu_count())
    if not entries or entries[0].isdigit():
        return [int(entry) for entry in entries]
    try:
        import pynvml

        pynvml.nvmlInit()
        if entries[0].startswith("MIG-"):
            # Not seen on a GPU here (no MIG on the machines lent): NVML's own lookup.
            return [pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(e)) for e in entries]
        uuids = [
            _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    except Exception:
        log.warning("cannot find the GPUs of CUDA_VISIBLE_DEVICES=%s through NVML", text)
        return []
    indices: list[int] = []
    for entry in entries:
        matches = [index for index, uuid in enumerate(uuids) if uuid.startswith(entry)]
        if len(matches) != 1:
            log.warning("CUDA_VISIBLE_DEVICES entry %s names %d GPUs, not one", entry, len(matches))
            break
        if matches[0] in indices:
            return []
        indices.append(matches[0])
    return indices


def _gpu_count() -> int | None:
    """How many GPUs NVML sees, or None where it cannot tell (device numbers then go unchecked)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return None


def _text(value: str | bytes) -> str:
    """NVML's strings are bytes in older bindings."""
    return value.decode() if isinstance(value, bytes) else value


def process_gpu_memory(pids: Sequence[int], devices: Sequence[int]) -> dict[int, int] | None:
    """GPU memory the processes `pids` and their children (tensor-parallel workers) hold on each
    of `devices` (NVML indices), where NVML tells per process (not in every container); else
    None."""
    if not pids:
        return None
    try:
        import psutil
        import pynvml

        family = set(pids)
        for pid in pids:
            family.update(child.pid for child in psutil.Process(pid).children(recursive=True))
        pynvml.nvmlInit()
        try:
            held = {}
            for device in devices:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device)
                found = [
                    p.usedGpuMemory
                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                    if p.pid in family
                ]
                if not found or any(not isinstance(used, int) for used in found):
                    return None  # hidden (a container without the host's process table)
                held[device] = sum(found)
            return held
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
