"""Memory of an engine's processes as strangers send distinct pictures, with vLLM's own cache of
processed media (4 GiB an engine) against the app's bound (`APP_MEDIA_CACHE_BYTES`), side by
side in one run on the Qwen2-VL demo twin (random weights, CPU).

    .venv/bin/python bench/bench_media_cache.py [--pictures 800] [--size 448] [--bound 512MiB]

Target: with the app's bound, the engine's processes grow by at most about the bound (the
engine process holds the items; the app's keeps their keys); with vLLM's default they grow with
every distinct picture.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.demo.models import use_local_vllm_environment

use_local_vllm_environment(Path(tempfile.mkdtemp(prefix="bench-media-cache-")))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from app.catalog.cards import ModelCard, load_cards  # noqa: E402
from app.config import Settings  # noqa: E402
from app.demo.twins import build_twin, twin_settings  # noqa: E402
from app.engines.base import SamplingSettings  # noqa: E402
from app.engines.manager import EngineManager  # noqa: E402
from app.engines.vllm_engine import VllmEngineFactory, process_tree_memory  # noqa: E402

KEY = "qwen2_vl"
VLLM_DEFAULT_GB = 4.0  # MultiModalConfig.mm_processor_cache_gb in vLLM 0.32


class VllmDefault(VllmEngineFactory):
    """The app's engine arguments with vLLM's own cache size, for the comparison."""

    def engine_args(self, card: ModelCard, devices: tuple[int, ...] = (0,)) -> dict[str, Any]:
        return {**super().engine_args(card, devices), "mm_processor_cache_gb": VLLM_DEFAULT_GB}


async def grow(settings: Settings, factory: VllmEngineFactory, pictures: int, size: int) -> list[int]:
    """The process tree's resident memory (MiB) after the first picture and after each quarter."""
    card = load_cards()[KEY]
    manager = EngineManager({KEY: card}, settings, factory)
    one_token = SamplingSettings(temperature=0.0, max_tokens=1, ignore_eos=True)
    marks = {0, pictures // 4, pictures // 2, 3 * pictures // 4, pictures - 1}
    readings = []
    try:
        for i in range(pictures):
            pixels = np.random.default_rng(i).integers(0, 255, (size, size, 3), dtype=np.uint8)
            message = [{"type": "image", "image": Image.fromarray(pixels)}, {"type": "text", "text": "What?"}]
            async for _ in manager.stream(KEY, [{"role": "user", "content": message}], one_token):
                pass
            if i in marks:
                readings.append(process_tree_memory()[0] >> 20)
    finally:
        await manager.close()
    return readings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pictures", type=int, default=800)
    parser.add_argument("--size", type=int, default=448)
    parser.add_argument("--bound", default=None, help="APP_MEDIA_CACHE_BYTES (default: the app's)")
    args = parser.parse_args()
    folder = build_twin(load_cards()[KEY], Path(tempfile.mkdtemp(prefix="twin-")))
    bound = {} if args.bound is None else {"media_cache_bytes": args.bound}
    settings = twin_settings({KEY: folder}, **bound)
    started = time.strftime("%Y-%m-%d %H:%M")
    size = f"{args.size}x{args.size}"
    print(f"{started}, {platform.node()}, {args.pictures} distinct {size} pictures, the {KEY} twin")
    bound_mib = settings.media_cache_bytes >> 20
    print(f"app's bound: {bound_mib} MiB a process; vLLM's default: {VLLM_DEFAULT_GB:g} GiB")
    print("| cache | after 1 | after 1/4 | 1/2 | 3/4 | all | growth |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    factories = (("vLLM's default", VllmDefault(settings)), ("app's bound", VllmEngineFactory(settings)))
    for name, factory in factories:
        readings = asyncio.run(grow(settings, factory, args.pictures, args.size))
        cells = " | ".join(f"{mib} MiB" for mib in readings)
        print(f"| {name} | {cells} | +{readings[-1] - readings[0]} MiB |", flush=True)


if __name__ == "__main__":
    main()
