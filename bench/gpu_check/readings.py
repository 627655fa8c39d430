"""`--readings`: the app's own GPU readings, checked on a real GPU against known allocations.

The app finds its GPUs, sizes its budget and measures what each engine's build took through
NVML (`app.config.detect_gpu_count`, `app.engines.gpus`, `app.engines.metrics`). Those
readings decide what fits, and nothing else checks them on a GPU: the engine check needs vLLM's
CUDA build, these need only a CUDA build of torch and NVML. A process that holds a known number
of bytes on the GPU stands in for an engine (directly, and as the child of a process that never
starts CUDA, as an engine core's workers are), and each reading is compared with it.

This process never starts CUDA itself: the holders and probes are fresh interpreters.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from .common import GIB, describe_error, gib, log
from .machine import Gpu, wait_for_memory

HOLD_BYTES = 8 * GIB
# What a process's CUDA context may add to what it allocates, on any GPU (a few hundred MiB).
CONTEXT_ALLOWANCE_BYTES = 2 * GIB
READY_TIMEOUT_S = 180.0
GONE_TIMEOUT_S = 10.0  # SIGKILL ends a process at once unless the kernel holds it (a GPU call)

# Allocates argv[1] bytes on the GPU and touches them, says "ready" with what torch reserved, and
# holds them until its standard input closes.
HOLDER = """
import sys, torch
held = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
held.fill_(1)
torch.cuda.synchronize()
print("ready", torch.cuda.memory_reserved(), flush=True)
sys.stdin.read()
"""
# Starts the holder as its child and waits for it, never starting CUDA itself (an engine core
# with a worker process).
PARENT = """
import subprocess, sys
sys.exit(subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]]).returncode)
"""
# What CUDA itself says of the GPU: its total memory, free memory, device count and UUID.
CUDA_FACTS = """
import torch
free, total = torch.cuda.mem_get_info()
props = torch.cuda.get_device_properties(0)
print(torch.cuda.device_count(), total, free, getattr(props, "uuid", ""))
"""


def within(measured: int | None, held: int) -> bool:
    """A reading of a holder of `held` bytes: at least those, and no more than a context above."""
    return measured is not None and held <= measured <= held + CONTEXT_ALLOWANCE_BYTES


def group_alive(group: int) -> bool:
    """Whether a process of process group `group` still lives (a zombie does not: it holds
    nothing, and waits only for its parent to read its end)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat"), encoding="utf-8") as stat:
                # "pid (name) state parent group ...": the name may hold spaces and brackets.
                state, _parent, process_group, *_ = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(process_group) == group and state != "Z":
            return True
    return False


class Holder:
    """A fresh interpreter holding `size` bytes on the GPU, directly or as a child of one that
    never starts CUDA (`via_parent`); `pid` is the outer process."""

    def __init__(self, size: int, via_parent: bool = False) -> None:
        command = [sys.executable, "-c", HOLDER, str(size)]
        if via_parent:
            command = [sys.executable, "-c", PARENT, HOLDER, str(size)]
        self.process = subprocess.Popen(  # noqa: S603 - this Python, fixed code
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        self.pid = self.process.pid
        line = self._ready_line()
        self.reserved = int(line.split()[1])

    def _ready_line(self) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        stdout = self.process.stdout
        while stdout is not None and (left := deadline - time.monotonic()) > 0:
            # readline() alone would wait for ever on a holder stuck starting CUDA.
            if not select.select([stdout], [], [], left)[0]:
                break
            line = stdout.readline()
            if line.startswith("ready"):
                return line
            if not line:
                break
        self.kill()
        raise RuntimeError("the holder did not allocate its memory")

    def kill(self) -> None:
        """Ends the holder and its child at once (a stuck one may never read its input), and
        returns once neither lives: a child still dying holds its memory for the next reading
        (on a loaded machine a test found the child still running just after the parent ended)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while group_alive(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()


def cuda_facts(env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(  # noqa: S603 - this Python, fixed code
        [sys.executable, "-c", CUDA_FACTS], capture_output=True, text=True, timeout=180, env=env
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    count, total, free, uuid = [*done.stdout.split(), ""][:4]
    return {"device_count": int(count), "total": int(total), "free": int(free), "uuid": uuid}


def nvml_processes() -> list[dict[str, Any]]:
    """NVML's own list of compute processes on GPU 0, as it gives them."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return [
        {"pid": p.pid, "used": p.usedGpuMemory} for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    ]


def run_readings() -> dict[str, Any]:
    """Every reading, each with its verdict (`ok`: True, False, or None where only recorded)."""
    import pynvml

    from app.config import Settings, detect_gpu_count
    from app.engines.gpus import gpu_memory, process_gpu_memory, visible_devices
    from app.engines.metrics import measured_gpu_memory
    from app.engines.vllm_engine import VllmEngineFactory

    steps: list[dict[str, Any]] = []

    def step(name: str, action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        log(name)
        try:
            entry = {"step": name, **action()}
        except Exception as error:
            entry = {"step": name, "ok": False, "error": describe_error(error)}
        steps.append(entry)
        return entry

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    idle = gpu_memory("used")
    idle_used = idle[0] if idle else None

    def devices_found() -> dict[str, Any]:
        detected = detect_gpu_count(os.environ)
        count = pynvml.nvmlDeviceGetCount()
        return {"ok": detected == count, "app_detects": detected, "nvml_count": count}

    def totals() -> dict[str, Any]:
        app_total = gpu_memory("total")
        cuda = cuda_facts()
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)  # NVML's first call, as nvidia-smi's total
        entry: dict[str, Any] = {
            "app_total_gib": gib(app_total[0]) if app_total else None,
            "cuda_total_gib": gib(cuda.get("total")),
            "nvml_v1_total_gib": gib(int(info.total)),
            "nvml_v1_idle_used_gib": gib(int(info.used)),
            "app_idle_used_gib": gib(idle_used),
        }
        # The app's budget is a share of its total: it must be what CUDA (and so vLLM) can use.
        entry["ok"] = bool(app_total) and "total" in cuda and abs(app_total[0] - cuda["total"]) <= 64 * 2**20
        return entry

    def capacity() -> dict[str, Any]:
        factory = VllmEngineFactory(Settings(gpu_count=1))
        cap = factory.capacity()
        return {
            "ok": len(cap.device_budgets) == 1 and cap.device_budgets[0] > 0,
            "budget_gib": gib(cap.device_budgets[0]),
            "host_budget_gib": gib(cap.host_budget),
        }

    def held(via_parent: bool) -> Callable[[], dict[str, Any]]:
        def measure() -> dict[str, Any]:
            before = gpu_memory("used")
            holder = Holder(HOLD_BYTES, via_parent=via_parent)
            try:
                after = gpu_memory("used")
                per_process = process_gpu_memory([holder.pid], [0])
                listed = nvml_processes()
                gauge = measured_gpu_memory()
            finally:
                holder.close()
            back = wait_for_memory(before[0] if before else None)
            difference = after[0] - before[0] if before and after else None
            process_bytes = per_process.get(0) if per_process else None
            return {
                # The build's footprint as the factory measures it: per process where NVML says,
                # else the change in what the GPU has in use.
                "ok": within(process_bytes, HOLD_BYTES)
                and within(difference, HOLD_BYTES)
                and bool(back.get("memory_back"))
                and bool(gauge)
                and abs(gauge[0] - after[0]) < GIB,
                "held_gib": gib(HOLD_BYTES),
                "torch_reserved_gib": gib(holder.reserved),
                "per_process_gib": gib(process_bytes),
                "used_difference_gib": gib(difference),
                "metrics_gauge_gib": gib(gauge[0]) if gauge else None,
                "nvml_processes": [{"pid": p["pid"], "used_gib": gib(p["used"])} for p in listed],
                "holder_pid": holder.pid,
                **back,
            }

        return measure

    def visible(text: str) -> Callable[[], dict[str, Any]]:
        def check() -> dict[str, Any]:
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": text}
            cuda = cuda_facts(env)
            app_reads = visible_devices(env)
            cuda_sees = cuda.get("device_count", 0) if "error" not in cuda else 0
            # The app must count and name the GPUs CUDA sees under this setting (NVML's 0 here).
            app_detects = detect_gpu_count(env)
            return {
                "ok": app_detects == cuda_sees
                and ((app_reads == [0]) if cuda_sees == 1 else (app_reads in ([], None))),
                "cuda_visible_devices": text,
                "cuda_device_count": cuda_sees,
                "app_nvml_indices": app_reads,
                "app_detects": app_detects,
            }

        return check

    def machine() -> dict[str, Any]:
        gpu = Gpu.get()
        return {"ok": True, **gpu.describe(), "capability": gpu.capability()}

    step("machine", machine)
    step("the app finds the GPUs", devices_found)
    step("total memory: NVML and CUDA", totals)
    step("the factory's capacity", capacity)
    step(f"a process holding {gib(HOLD_BYTES)} GiB", held(via_parent=False))
    step(f"a child process holding {gib(HOLD_BYTES)} GiB", held(via_parent=True))
    if pynvml.nvmlDeviceGetCount() == 1:
        # Each setting is checked against what CUDA then sees of this one GPU (NVML's 0).
        for text in ("0", uuid, uuid[:12], uuid.removeprefix("GPU-"), f"{uuid[:12]},GPU-zzzz", "GPU-", "1"):
            step(f"CUDA_VISIBLE_DEVICES={text}", visible(text))
    else:
        log("CUDA_VISIBLE_DEVICES is checked on a machine of one GPU only")
    return {"mode": "readings", "ok": all(s.get("ok") is not False for s in steps), "steps": steps}


def readings_markdown(report: dict[str, Any]) -> str:
    lines = ["| step | verdict | figures |", "| --- | --- | --- |"]
    for entry in report["steps"]:
        figures = ", ".join(f"{k} {v}" for k, v in entry.items() if k not in ("step", "ok"))
        verdict = {True: "ok", False: "**failed**", None: "recorded"}[entry.get("ok")]
        lines.append(f"| {entry['step']} | {verdict} | {figures} |")
    return "\n".join(lines)
