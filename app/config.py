"""Settings, read once from the environment (`APP_*`) and passed down."""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TRUE = {"1", "true", "yes", "on"}


def detect_gpu_count(env: Mapping[str, str], devices: Sequence[str] | None = None) -> int:
    """NVIDIA GPUs visible to this process, without importing torch: the device files,
    narrowed by CUDA_VISIBLE_DEVICES where it is set."""
    present = len(glob.glob("/dev/nvidia[0-9]*") if devices is None else devices)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    listed = [d for d in visible.split(",") if d.strip()]
    listed = listed[: next((i for i, d in enumerate(listed) if d.strip() == "-1"), len(listed))]
    return min(present, len(listed))


@dataclass(frozen=True)
class Settings:
    cards_dir: Path | None = None
    allow_remote_code: bool = False
    gpu_count: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        cards_dir = env.get("APP_CARDS_DIR")
        gpus = env.get("APP_GPU_COUNT")
        return cls(
            cards_dir=Path(cards_dir) if cards_dir else None,
            allow_remote_code=env.get("APP_ALLOW_REMOTE_CODE", "").strip().lower() in TRUE,
            gpu_count=int(gpus) if gpus else detect_gpu_count(env),
        )
