"""What vLLM's sleep mode (level 1) does with a model's weights, timed with torch on a GPU.

Level 1 copies each weight tensor into pinned host memory and frees the GPU's copy; a wake copies
them back. vLLM is not needed to time that mechanism: this allocates a block of weights' size on
the GPU, then times, as sleep and wake do them, the pinned host allocation, the copy to the host,
and the copy back, and reads how much host memory the sleeping copy holds (the drop in the machine's
available memory: pinned memory may not show in a process's resident size). The simulated GPU
(`bench/simulated_gpu.py`) takes its sleep time from these figures.

    python3 bench/bench_sleep_copies.py            # on a machine with torch's CUDA build

Prints a markdown table for docs/BENCHMARKS.md; status 2, with one line, where there is no GPU.
"""

from __future__ import annotations

import datetime
import platform
import sys
import time

SIZES_GIB = (2, 8, 16)
ROUNDS = 3


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    try:
        import psutil
        import torch
    except ImportError as error:
        print(f"bench_sleep_copies needs torch and psutil ({error.name} is missing).", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print("bench_sleep_copies needs an NVIDIA GPU and torch's CUDA build (none here).", file=sys.stderr)
        sys.exit(2)
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {torch.cuda.get_device_name(0)}; "
        f"torch {torch.__version__}; Python {platform.python_version()}; median of {ROUNDS}\n"
    )
    print(
        "| weights, GiB | pin host memory, s | GPU to host, s (GB/s) | host to GPU, s (GB/s) "
        "| host memory held, GiB |"
    )
    print("| --- | --- | --- | --- | --- |")
    for size_gib in SIZES_GIB:
        size = size_gib * 2**30
        weights = torch.ones(size, dtype=torch.uint8, device="cuda")
        pins, downs, ups, held = [], [], [], []
        for _ in range(ROUNDS):
            torch.cuda.synchronize()
            # torch keeps freed pinned blocks for reuse; each round pins afresh, as a sleep does.
            getattr(torch._C, "_host_emptyCache", lambda: None)()
            available = psutil.virtual_memory().available
            start = time.perf_counter()
            host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            pins.append(time.perf_counter() - start)
            start = time.perf_counter()
            host.copy_(weights, non_blocking=True)
            torch.cuda.synchronize()
            downs.append(time.perf_counter() - start)
            held.append(available - psutil.virtual_memory().available)
            start = time.perf_counter()
            weights.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            ups.append(time.perf_counter() - start)
            del host
        del weights
        torch.cuda.empty_cache()

        gb = size / 1e9
        print(
            f"| {size_gib} | {median(pins):.2f} | {median(downs):.2f} ({gb / median(downs):.0f}) "
            f"| {median(ups):.2f} ({gb / median(ups):.0f}) | {median(held) / 2**30:.2f} |"
        )


if __name__ == "__main__":
    main()
