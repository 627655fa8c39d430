"""What an operator scrapes (`APP_METRICS`, Prometheus text at `/metrics`): the manager's builds,
wakes, sleeps and unloads with their durations, queue waits, time to first token and tokens per
second (as `EngineEvents`), and at each scrape every model's state and the memory the scheduler
has booked on each device, beside what NVML measures there where a GPU is.

Its own registry, so that several managers in one process (tests, `python -m app eval`) never
clash; vLLM's own metrics (`vllm:*`, in prometheus_client's default registry) are served beside
it by the page (`app.views.metrics`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from app.engines.base import EngineEvents, ModelState
from app.engines.gpus import gpu_memory, visible_devices

if TYPE_CHECKING:
    from app.engines.manager import EngineManager

log = logging.getLogger(__name__)

# Builds on a GPU take 20 s to several minutes; wakes and sleeps, a second or two.
LOAD_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
SPEED_BUCKETS = (1, 2, 5, 10, 20, 40, 60, 100, 150, 250, 500)


class EngineMetrics(EngineEvents):
    """The manager's `EngineEvents`, counted; `watch(manager)` adds its state at each scrape."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.loads = Counter("vlm_engine_loads", "Engines made ready, by how", ["model", "how"], registry=r)
        self.load_seconds = Histogram(
            "vlm_engine_load_seconds",
            "Time to build or wake an engine",
            ["model", "how"],
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.load_failures = Counter(
            "vlm_engine_load_failures", "Builds or wakes that failed", ["model"], registry=r
        )
        self.sleeps = Histogram(
            "vlm_engine_sleep_seconds",
            "Time to put an engine to sleep",
            ["model"],
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.unloads = Histogram(
            "vlm_engine_unload_seconds",
            "Time to shut an engine down",
            ["model"],
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.waits = Histogram(
            "vlm_queue_wait_seconds",
            "Time a request waited for its engine (in line, or while it was built)",
            ["model"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.first_token = Histogram(
            "vlm_time_to_first_token_seconds",
            "Time from the engine taking a request to its first text",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.speed = Histogram(
            "vlm_tokens_per_second",
            "Generation speed of each answer after its first token",
            ["model"],
            buckets=SPEED_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("vlm_generated_tokens", "Tokens generated", ["model"], registry=r)

    def watch(self, manager: EngineManager) -> None:
        self.registry.register(_ManagerState(manager))

    # --- what the manager tells (EngineEvents) ---

    def loaded(self, key: str, seconds: float, woke: bool) -> None:
        how = "wake" if woke else "build"
        self.loads.labels(key, how).inc()
        self.load_seconds.labels(key, how).observe(seconds)

    def load_failed(self, key: str) -> None:
        self.load_failures.labels(key).inc()

    def slept(self, key: str, seconds: float) -> None:
        self.sleeps.labels(key).observe(seconds)

    def unloaded(self, key: str, seconds: float) -> None:
        self.unloads.labels(key).observe(seconds)

    def waited(self, key: str, seconds: float) -> None:
        self.waits.labels(key).observe(seconds)

    def answered(self, key: str, first_token_s: float | None, tokens: int, seconds: float) -> None:
        self.tokens.labels(key).inc(tokens)
        if first_token_s is not None:
            self.first_token.labels(key).observe(first_token_s)
            if tokens > 1 and seconds > first_token_s:
                self.speed.labels(key).observe((tokens - 1) / (seconds - first_token_s))


class _ManagerState(Collector):
    """Read at each scrape, so it never drifts from the manager: each model's state (1 for the
    one it is in), the requests it is answering, and memory booked against measured."""

    def __init__(self, manager: EngineManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[GaugeMetricFamily]:
        states = GaugeMetricFamily(
            "vlm_model_state", "1 for the state each model is in", labels=["model", "state"]
        )
        in_flight = GaugeMetricFamily("vlm_requests_in_flight", "Answers being generated", labels=["model"])
        for key in self.manager.cards:
            status = self.manager.status(key)
            for state in ModelState:
                states.add_metric([key, state.name.lower()], float(status.state is state))
            in_flight.add_metric([key], float(status.in_flight))
        yield states
        yield in_flight
        booked = GaugeMetricFamily(
            "vlm_memory_booked_bytes",
            "Memory the scheduler has booked for engines on each device (GPU, or host on CPU)",
            labels=["device"],
        )
        budget = GaugeMetricFamily(
            "vlm_memory_budget_bytes", "What engines may book on each device", labels=["device"]
        )
        capacity = self.manager.capacity()
        totals = [0] * len(capacity.device_budgets)
        for resident in self.manager.residents():
            for device in resident.devices:
                if device < len(totals):
                    totals[device] += resident.usage()
        for device, (used, limit) in enumerate(zip(totals, capacity.device_budgets, strict=True)):
            booked.add_metric([str(device)], float(used))
            budget.add_metric([str(device)], float(limit))
        yield booked
        yield budget
        measured = measured_gpu_memory()
        if measured:
            family = GaugeMetricFamily(
                "vlm_gpu_memory_used_bytes", "GPU memory in use as NVML measures it", labels=["device"]
            )
            for device, used in enumerate(measured):
                family.add_metric([str(device)], float(used))
            yield family


def measured_gpu_memory() -> list[int]:
    """Bytes in use on each of the app's GPUs as NVML says (numbered as the app numbers them,
    through CUDA_VISIBLE_DEVICES), or nothing where there is no NVML (a CPU machine): NVML counts
    every process, so it shows what the scheduler's booking misses."""
    used = gpu_memory("used", warn=False) or []
    visible = visible_devices()
    return used if visible is None else [used[i] for i in visible if i < len(used)]
