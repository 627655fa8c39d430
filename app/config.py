"""Settings, read once from the environment (`APP_*`) and passed down.

The app's command line overrides the same fields (`Settings.with_overrides`); nothing else in
the app reads the environment for its own settings.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

TRUE = {"1", "true", "yes", "on"}
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


class SettingsError(ValueError):
    """A setting the operator wrote that cannot be used; the message names the variable."""


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
class MemoryBudget:
    """What all resident engines may use together: a fraction of each GPU, or bytes."""

    fraction: float | None = 0.9
    bytes: int | None = None

    @classmethod
    def parse(cls, text: str) -> MemoryBudget:
        text = text.strip().lower().replace(" ", "")
        if re.fullmatch(r"0?\.\d+|1(\.0*)?", text):
            return cls(fraction=float(text))
        try:
            return cls(fraction=None, bytes=parse_bytes("APP_MEMORY_BUDGET", text, 0))
        except SettingsError:
            raise SettingsError(
                f"APP_MEMORY_BUDGET={text!r}: write a fraction like 0.9 or bytes like 40GiB"
            ) from None

    def describe(self) -> str:
        if self.bytes is not None:
            return f"{self.bytes / 2**30:.1f} GiB"
        return f"{self.fraction:.0%} of GPU memory"


def parse_bytes(name: str, text: str, default: int) -> int:
    """`200MB`, `1.5GiB` or a plain number of bytes; `default` when empty."""
    text = text.strip().lower().replace(" ", "")
    if not text:
        return default
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", text)
    if not match or match.group(2) not in UNITS:
        raise SettingsError(f"{name}={text!r}: write bytes like 200MB or 1GiB")
    return int(float(match.group(1)) * UNITS[match.group(2)])


def parse_mapping(name: str, text: str) -> dict[str, str]:
    """`key=value,key=value` (spaces allowed) into a dict; the variable name is in errors."""
    mapping = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise SettingsError(f"{name}: {item!r} is not of the form card_key=value")
        mapping[key.strip()] = value.strip()
    return mapping


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name}={text!r} is not a number") from None
    if value < 0:
        raise SettingsError(f"{name}={text!r} must not be negative")
    return value


@dataclass(frozen=True)
class Settings:
    cards_dir: Path | None = None
    allow_remote_code: bool = False
    gpu_count: int = 0
    default_model: str | None = None
    memory_budget: MemoryBudget = field(default_factory=MemoryBudget)
    # An optional cap on engines awake at once; None: as many as fit in the memory budget.
    max_resident: int | None = None
    # Seconds a model in use keeps the GPU while another model's requests wait for it.
    quantum_s: float = 30.0
    # Host memory for sleeping engines' weights (CUDA sleep mode); None: half the machine's RAM.
    host_memory_budget: int | None = None
    # Seconds an engine may sit unused before it is unloaded (0: never).
    idle_unload_s: float = 1800.0
    # Seconds a swap waits for answers in flight on the engine it evicts before stopping them.
    drain_timeout_s: float = 60.0
    # None: eager on CPU (compiling costs more than it gains for a demo), compiled on GPU.
    enforce_eager: bool | None = None
    # KV cache per engine where no GPU sizes it (CPU); vLLM would otherwise take half the RAM.
    cpu_kv_cache_bytes: int = 256 * 2**20
    model_folders: dict[str, Path] = field(default_factory=dict)
    # vLLM's load_format for local engines: "dummy" makes random weights (twins, benchmarks).
    load_format: str | None = None
    # Overrides every card's tensor_parallel_size (twins on CPU run at 1); None: the card's.
    tensor_parallel_size: int | None = None
    remote_engines: dict[str, str] = field(default_factory=dict)
    hf_cache: Path | None = None
    # --- the web app ---
    host: str = "127.0.0.1"
    port: int = 7860
    share: bool = False
    # Card keys offered in the UI (empty: the whole catalog).
    models: tuple[str, ...] = ()
    # Tiny random-weight models for trying the interface; None: only when nothing else is servable.
    demo_models: bool | None = None
    demo_dir: Path | None = None
    # Events waiting in the queue before new ones are refused, and answers generated at once per view.
    queue_size: int = 64
    concurrency: int = 16
    max_upload_bytes: int = 200 * 10**6

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        cards_dir = env.get("APP_CARDS_DIR")
        gpus = env.get("APP_GPU_COUNT")
        eager = env.get("APP_ENFORCE_EAGER", "").strip().lower()
        hf_cache = env.get("APP_HF_CACHE")
        budget = env.get("APP_MEMORY_BUDGET", "").strip()
        demo = env.get("APP_DEMO_MODELS", "").strip().lower()
        demo_dir = env.get("APP_DEMO_DIR")
        return cls(
            cards_dir=Path(cards_dir) if cards_dir else None,
            allow_remote_code=env.get("APP_ALLOW_REMOTE_CODE", "").strip().lower() in TRUE,
            gpu_count=int(gpus) if gpus else detect_gpu_count(env),
            default_model=env.get("APP_DEFAULT_MODEL") or None,
            memory_budget=MemoryBudget.parse(budget) if budget else MemoryBudget(),
            max_resident=max(1, int(_number(env, "APP_MAX_RESIDENT", 1)))
            if env.get("APP_MAX_RESIDENT", "").strip()
            else None,
            quantum_s=_number(env, "APP_QUANTUM_S", cls.quantum_s),
            host_memory_budget=parse_bytes("APP_HOST_MEMORY_BUDGET", env.get("APP_HOST_MEMORY_BUDGET", ""), 0)
            or None,
            idle_unload_s=_number(env, "APP_IDLE_UNLOAD_S", cls.idle_unload_s),
            drain_timeout_s=_number(env, "APP_DRAIN_TIMEOUT_S", cls.drain_timeout_s),
            enforce_eager=(eager in TRUE) if eager else None,
            cpu_kv_cache_bytes=int(_number(env, "APP_CPU_KV_CACHE_BYTES", cls.cpu_kv_cache_bytes)),
            model_folders={
                key: Path(path)
                for key, path in parse_mapping("APP_MODEL_FOLDERS", env.get("APP_MODEL_FOLDERS", "")).items()
            },
            remote_engines=parse_mapping("APP_REMOTE_ENGINES", env.get("APP_REMOTE_ENGINES", "")),
            hf_cache=Path(hf_cache) if hf_cache else None,
            load_format=env.get("APP_LOAD_FORMAT", "").strip() or None,
            host=env.get("APP_HOST", "").strip() or cls.host,
            port=int(_number(env, "APP_PORT", cls.port)),
            share=env.get("APP_SHARE", "").strip().lower() in TRUE,
            models=tuple(k.strip() for k in env.get("APP_MODELS", "").split(",") if k.strip()),
            demo_models=(demo in TRUE) if demo else None,
            demo_dir=Path(demo_dir) if demo_dir else None,
            queue_size=max(1, int(_number(env, "APP_QUEUE_SIZE", cls.queue_size))),
            concurrency=max(1, int(_number(env, "APP_CONCURRENCY", cls.concurrency))),
            max_upload_bytes=parse_bytes(
                "APP_MAX_UPLOAD", env.get("APP_MAX_UPLOAD", ""), cls.max_upload_bytes
            ),
        )

    def with_overrides(self, **values: Any) -> Settings:
        """These settings with the given fields replaced; `None` values (flags not given) are skipped."""
        known = {f.name for f in fields(self)}
        unknown = set(values) - known
        if unknown:
            raise SettingsError(f"unknown settings: {sorted(unknown)}")
        return replace(self, **{k: v for k, v in values.items() if v is not None})

    def check_keys(self, catalog: Iterable[str]) -> None:
        """Refuses settings that name models the catalog does not have (a typo would otherwise
        silently leave a model on the wrong engine)."""
        known = set(catalog)
        named = {
            "APP_DEFAULT_MODEL": {self.default_model} - {None},
            "APP_MODEL_FOLDERS": set(self.model_folders),
            "APP_REMOTE_ENGINES": set(self.remote_engines),
            "APP_MODELS": set(self.models),
        }
        for variable, keys in named.items():
            if unknown := sorted(keys - known):
                raise SettingsError(f"{variable} names {unknown}, not in the catalog")

    @property
    def eager(self) -> bool:
        return self.gpu_count == 0 if self.enforce_eager is None else self.enforce_eager
