"""An operator's metrics (`APP_METRICS`, `app.engines.metrics`, `app.views.metrics`): on the
SIMULATED GPU (`bench/simulated_gpu.py`, realistic build, wake, sleep and decode times on a
virtual clock) every build, wake, sleep, wait and answer is counted with its duration; on the
real engine, `/metrics` is scraped over HTTP while two users chat."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gradio_client import Client
from ports import free_port
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from simulated_gpu import (
    GIB,
    SimulatedFactory,
    SimulatedMachine,
    SimulatedModel,
    VirtualTimeLoop,
    simulated_cards,
)

from app.catalog.cards import load_cards
from app.config import Settings
from app.demo.models import SEEING_FOLDER
from app.demo.seeing_model import BASE_CARD, SEEING_KEY, seeing_card
from app.engines.base import EngineEvents, SamplingSettings, StreamEnd
from app.engines.manager import EngineManager
from app.engines.metrics import EngineMetrics
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import History, sqlite_url
from app.views import Playground, build, launch

MESSAGE = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
GPU_BUDGET = 70 * GIB


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(seen: dict, name: str, **labels: str) -> float:
    return seen.get((name, tuple(sorted(labels.items()))), 0.0)


def test_builds_wakes_sleeps_waits_and_answers_are_counted_with_their_simulated_durations():
    """One engine at a time: "one" answers, sleeps for "two", wakes for its second answer, and
    goes to sleep again when "two" is asked once more; every figure is the simulation's own."""
    models = [SimulatedModel("one", 8.0), SimulatedModel("two", 8.0)]
    loop = VirtualTimeLoop()
    machine = SimulatedMachine((GPU_BUDGET,), host_budget=100 * GIB, clock=loop.time)
    factory = SimulatedFactory(machine, models)
    settings = Settings(gpu_count=1, max_resident=1, quantum_s=30, drain_timeout_s=30)
    metrics = EngineMetrics()
    manager = EngineManager(simulated_cards(models), settings, factory, clock=loop.time, events=metrics)
    metrics.watch(manager)
    scraped: list[str] = []

    async def ask(key: str, tokens: int = 101) -> StreamEnd | None:
        end = None
        async for event in manager.stream(key, MESSAGE, SamplingSettings(max_tokens=tokens, ignore_eos=True)):
            end = event if isinstance(event, StreamEnd) else end
        return end

    async def scenario() -> list[StreamEnd | None]:
        ends = [await ask("one"), await ask("two")]
        scraped.append(generate_latest(metrics.registry).decode())  # "two" ready, "one" asleep
        ends.append(await ask("one"))
        await manager.close()
        return ends

    try:
        ends = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert all(end is not None and end.completion_tokens == 101 for end in ends)
    seen = samples(generate_latest(metrics.registry).decode())
    one, two = models
    # Builds and wakes, each with the simulated time it took.
    assert value(seen, "vlm_engine_loads_total", model="one", how="build") == 1
    assert value(seen, "vlm_engine_loads_total", model="one", how="wake") == 1
    assert value(seen, "vlm_engine_loads_total", model="two", how="build") == 1
    build_sum = value(seen, "vlm_engine_load_seconds_sum", model="one", how="build")
    assert build_sum == pytest.approx(one.build_s, rel=0.05)
    assert value(seen, "vlm_engine_load_seconds_sum", model="one", how="wake") == pytest.approx(
        one.wake_s, rel=0.1
    )
    # "one" slept for "two", then "two" slept for "one".
    assert value(seen, "vlm_engine_sleep_seconds_count", model="one") == 1
    assert value(seen, "vlm_engine_sleep_seconds_sum", model="one") == pytest.approx(one.sleep_s, rel=0.1)
    assert value(seen, "vlm_engine_sleep_seconds_count", model="two") == 1
    # Every answer: its wait (the build or wake included), first token and speed.
    assert value(seen, "vlm_queue_wait_seconds_count", model="one") == 2
    assert value(seen, "vlm_queue_wait_seconds_sum", model="one") >= one.build_s + one.wake_s
    assert value(seen, "vlm_time_to_first_token_seconds_count", model="one") == 2
    ttft = value(seen, "vlm_time_to_first_token_seconds_sum", model="one") / 2
    assert ttft == pytest.approx(one.first_token_s, abs=0.1)
    speed = value(seen, "vlm_tokens_per_second_sum", model="two") / value(
        seen, "vlm_tokens_per_second_count", model="two"
    )
    assert speed == pytest.approx(two.tokens_per_s, rel=0.1)
    assert value(seen, "vlm_generated_tokens_total", model="one") == 202
    # The state at a scrape is the manager's: "two" ready, "one" asleep, memory booked for both.
    mid = samples(scraped[0])
    assert value(mid, "vlm_model_state", model="two", state="ready") == 1
    assert value(mid, "vlm_model_state", model="one", state="sleeping") == 1
    assert value(mid, "vlm_model_state", model="one", state="ready") == 0
    booked = value(mid, "vlm_memory_booked_bytes", device="0")
    assert booked == two.need.per_device + one.need.asleep_per_device
    assert value(mid, "vlm_memory_budget_bytes", device="0") >= booked
    # After the close, nothing is loaded and nothing is booked.
    assert value(seen, "vlm_model_state", model="one", state="not_loaded") == 1
    assert value(seen, "vlm_memory_booked_bytes", device="0") == 0


# --- the real engine, over HTTP --------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Playground, str]]:
    settings = Settings(gpu_count=0, port=free_port(), metrics=True, default_model=SEEING_KEY)
    cards = {SEEING_KEY: seeing_card(load_cards()[BASE_CARD], SEEING_FOLDER)}
    manager = EngineManager(cards, settings, VllmEngineFactory(settings))
    decoder = VideoDecoderPool(workers=1)
    data = tmp_path_factory.mktemp("metrics")
    history = History(sqlite_url(data), data / "media")
    playground = Playground(manager, settings, decoder, history)
    demo = launch(build(playground), settings, block=False, quiet=True)
    yield playground, f"http://127.0.0.1:{settings.port}/"
    playground.close()
    demo.close()
    history.close()
    decoder.close()


@pytest.mark.slow
@pytest.mark.vllm
def test_metrics_are_scraped_while_two_users_chat_with_vllms_own_beside_them(served):
    _, url = served
    picture = Path(__file__).resolve().parent.parent / "static" / "examples" / "shapes.png"
    answers: list[str] = []

    def chat() -> None:
        from gradio_client import handle_file

        message = {"text": "How many shapes are there?", "files": [handle_file(str(picture))]}
        answers.append(
            Client(url, verbose=False).predict(message, SEEING_KEY, "", 0.0, 1.0, 16, 0, api_name="/chat")
        )

    users = [threading.Thread(target=chat) for _ in range(2)]
    for user in users:
        user.start()
    for user in users:
        user.join(timeout=300)
    assert len(answers) == 2 and answers[0].strip() and answers[0] == answers[1]  # greedy: the same
    response = httpx.get(url + "metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    seen = samples(response.text)
    assert value(seen, "vlm_engine_loads_total", model=SEEING_KEY, how="build") == 1
    assert value(seen, "vlm_time_to_first_token_seconds_count", model=SEEING_KEY) == 2
    assert value(seen, "vlm_queue_wait_seconds_count", model=SEEING_KEY) == 2
    assert value(seen, "vlm_model_state", model=SEEING_KEY, state="ready") == 1
    assert value(seen, "vlm_memory_booked_bytes", device="0") > 0
    assert ("vlm_open_tabs", ()) in seen
    # vLLM's own, from its engine in this process.
    vllm = {name for name, _ in seen if name.startswith("vllm:")}
    assert {"vllm:prompt_tokens_total", "vllm:generation_tokens_total"} <= vllm, sorted(vllm)[:20]


def test_without_the_setting_there_is_no_metrics_endpoint(tmp_path: Path):
    settings = Settings(gpu_count=0, port=free_port())
    decoder = VideoDecoderPool(workers=1)
    manager = EngineManager(load_cards(), settings, VllmEngineFactory(settings))
    playground = Playground(manager, settings, decoder, None)
    demo = launch(build(playground), settings, block=False, quiet=True)
    try:
        response = httpx.get(f"http://127.0.0.1:{settings.port}/metrics")
        assert "vlm_" not in response.text and "vllm:" not in response.text
        assert type(manager.events) is EngineEvents and playground.metrics is None  # nobody counts
    finally:
        demo.close()
        decoder.close()
    asyncio.run(manager.close())


@pytest.mark.vllm
def test_the_grafana_dashboard_asks_only_for_metrics_that_exist():
    """Every series the dashboard in docs/ plots is one the app or vLLM 0.32 exports: a renamed
    metric would leave a panel empty without a word."""
    import json
    import re

    import vllm.v1.metrics.loggers as vllm_loggers

    import app.engines.metrics as engine_metrics
    from app.domain.sessions import SessionStore
    from app.views.metrics import Visitors

    dashboard = json.loads(
        (Path(__file__).resolve().parent.parent / "docs/grafana/vlm-playground.json").read_text()
    )
    queries = " ".join(target["expr"] for panel in dashboard["panels"] for target in panel["targets"])
    metrics = EngineMetrics()
    metrics.registry.register(Visitors(SessionStore(60, 60)))
    families = list(metrics.registry.collect())
    ours = {sample.name for family in families for sample in family.samples} | {f.name for f in families}
    # The state collector's families need a manager; their names are fixed in the module.
    ours |= set(re.findall(r'"(vlm_[a-z_]+)"', Path(engine_metrics.__file__).read_text()))
    for name in set(re.findall(r"\bvlm_[a-z_]+", queries)):
        base = re.sub(r"_(bucket|sum|count|total)$", "", name)
        assert name in ours or base in ours, name
    vllm_source = Path(vllm_loggers.__file__).read_text()
    for name in set(re.findall(r"vllm:[a-z_]+", queries)):
        assert f'"{name}"' in vllm_source, name
