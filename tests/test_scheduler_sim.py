"""The real `EngineManager` on a SIMULATED GPU (bench/simulated_gpu.py): virtual time, GPU-like
build, wake and sleep times, memory per model. Random traces of users, models, stops, engine
deaths and failed builds (hypothesis) must keep the scheduler's promises:

- every request is answered, stopped by its user, or refused with a reason;
- no request waits longer than its bound (a quantum, a drain and a load per model ahead);
- the memory budgets (each GPU's, the host's for sleeping engines) are never exceeded;
- no engine is left behind once the manager is closed, and every engine is one the manager knows;
- every build serves the requests it was made for (no build evicted before serving).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import bench_scheduler
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simulated_gpu import (
    SimulatedFactory,
    SimulatedMachine,
    SimulatedModel,
    VirtualTimeLoop,
    simulated_cards,
)

from app.config import Settings
from app.engines.base import EngineError, ModelState, ModelStatus, SamplingSettings, StreamEnd
from app.engines.manager import EngineManager
from app.engines.memory import GIB, MemoryNeed
from app.engines.scheduler import Capacity, Eviction, Head, Phase, Resident, decide

# One 80 GB GPU at a 0.9 budget; together the models need more than that, so they swap.
MODELS = [
    SimulatedModel("small", 4.4),
    SimulatedModel("mid", 8.0),
    SimulatedModel("big", 16.0, kv_gb=6),
    SimulatedModel("huge", 40.0, kv_gb=8),
]
GPU_BUDGET = int(0.9 * 80e9)
QUANTUM_S, DRAIN_S = 30.0, 20.0
MESSAGE = [{"role": "user", "content": [{"type": "text", "text": "What is in the picture?"}]}]


@dataclass(frozen=True)
class Request:
    at: float
    model: int
    tokens: int
    stop_after: float | None


@dataclass(frozen=True)
class Trace:
    requests: list[Request]
    kills: list[tuple[float, int]] = field(default_factory=list)
    failures: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class Outcome:
    request: Request
    started: float = 0.0
    granted: float | None = None
    ended: float | None = None
    end: StreamEnd | None = None
    error: str | None = None
    stopped: bool = False


@dataclass
class Run:
    outcomes: list[Outcome]
    machine: SimulatedMachine
    factory: SimulatedFactory
    leaked_after_close: int
    unknown_engines: int


def simulate(
    trace: Trace, models: list[SimulatedModel], max_awake: int | None, sleep_mode: bool, gpus: int = 1
) -> Run:
    loop = VirtualTimeLoop()
    machine = SimulatedMachine((GPU_BUDGET,) * gpus, host_budget=100 * GIB, clock=loop.time)
    factory = SimulatedFactory(machine, models, sleep_mode=sleep_mode)
    app_settings = Settings(
        gpu_count=1, max_resident=max_awake, quantum_s=QUANTUM_S, drain_timeout_s=DRAIN_S, idle_unload_s=900
    )
    manager = EngineManager(simulated_cards(models), app_settings, factory, clock=loop.time)
    keys = [m.key for m in models]

    async def one(request: Request) -> Outcome:
        await asyncio.sleep(request.at)
        outcome = Outcome(request, started=loop.time())
        sampling = SamplingSettings(max_tokens=request.tokens, ignore_eos=True)
        try:
            async with contextlib.aclosing(manager.stream(keys[request.model], MESSAGE, sampling)) as events:
                async for event in events:
                    now = loop.time()
                    if not isinstance(event, ModelStatus) and outcome.granted is None:
                        outcome.granted = now
                    if isinstance(event, StreamEnd):
                        outcome.end = event
                    if request.stop_after is not None and now - outcome.started >= request.stop_after:
                        outcome.stopped = True
                        break
        except EngineError as error:
            outcome.error = str(error)
        outcome.ended = loop.time()
        return outcome

    async def kill(at: float, model: int) -> None:
        await asyncio.sleep(at)
        engine = manager.engines().get(keys[model])
        if engine is not None:
            engine[0].kill()

    async def fail(at: float, model: int) -> None:
        await asyncio.sleep(at)
        factory.fail_next.add(keys[model])

    async def main() -> tuple[list[Outcome], int, int]:
        side = [asyncio.create_task(kill(*k)) for k in trace.kills]
        side += [asyncio.create_task(fail(*f)) for f in trace.failures]
        # A livelock never finishes: the virtual deadline turns it into a failure.
        outcomes = await asyncio.wait_for(asyncio.gather(*(one(r) for r in trace.requests)), 50_000)
        await asyncio.gather(*side)
        await asyncio.sleep(200)  # builds under way end, dead engines are cleaned up
        known = {id(engine) for engine in manager.engines_held()}
        unknown = sum(1 for engine in machine.live if id(engine) not in known)
        await manager.close()
        return outcomes, len(machine.live), unknown

    try:
        outcomes, leaked, unknown = loop.run_until_complete(main())
    finally:
        loop.close()
    return Run(outcomes, machine, factory, leaked, unknown)


def wait_bound(models: list[SimulatedModel]) -> float:
    """Per model that can be ahead (all of them): a quantum, a drain, every other engine put to
    sleep or shut down, the slowest build; then a margin for dead engines' clean-up."""
    step = QUANTUM_S + DRAIN_S + len(models) * 4.0 + max(m.build_s for m in models) + 3.0
    return len(models) * step + 30.0


def check(run: Run, models: list[SimulatedModel], trace: Trace | None = None) -> None:
    bound = wait_bound(models)
    # Only an engine death or a failed build may fail a request (the models here all fit).
    faulty = {model for _, model in (trace.kills + trace.failures)} if trace else set()
    for outcome in run.outcomes:
        assert outcome.end is not None or outcome.error or outcome.stopped, outcome
        if outcome.error:
            assert "Traceback" not in outcome.error and len(outcome.error) > 10
            assert outcome.request.model in faulty, f"refused without a fault: {outcome}"
        waited = (outcome.granted or outcome.ended) - outcome.started
        assert waited <= bound, f"waited {waited:.0f} s (bound {bound:.0f} s): {outcome}"
    assert run.machine.violations == []
    assert run.leaked_after_close == 0 and run.unknown_engines == 0
    assert set(run.machine.device_used) == {0} and run.machine.host_used == 0
    # A build nobody used is one whose requests were all stopped or refused while it loaded.
    unused = sum(1 for engine in run.factory.engines if engine.served == 0)
    gave_up = sum(1 for o in run.outcomes if o.granted is None)
    assert unused <= gave_up


requests = st.builds(
    Request,
    at=st.floats(0, 900, allow_nan=False),
    model=st.integers(0, len(MODELS) - 1),
    tokens=st.integers(1, 800),
    stop_after=st.none() | st.floats(0, 200, allow_nan=False),
)
traces = st.builds(
    Trace,
    requests=st.lists(requests, min_size=1, max_size=40),
    kills=st.lists(st.tuples(st.floats(0, 900), st.integers(0, len(MODELS) - 1)), max_size=3),
    failures=st.lists(st.tuples(st.floats(0, 900), st.integers(0, len(MODELS) - 1)), max_size=3),
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, max_awake=st.sampled_from([None, 1, 2]), sleep_mode=st.booleans())
def test_random_traffic_keeps_every_promise(trace: Trace, max_awake: int | None, sleep_mode: bool):
    check(simulate(trace, MODELS, max_awake, sleep_mode), MODELS, trace)


# Two GPUs: a tensor-parallel model spans both, the others are placed on either.
TWO_GPU_MODELS = [*MODELS[:3], SimulatedModel("wide", 30.0, kv_gb=8, devices=2)]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, max_awake=st.sampled_from([None, 2]), sleep_mode=st.booleans())
def test_random_traffic_on_two_gpus_with_a_tensor_parallel_model(trace, max_awake, sleep_mode):
    run = simulate(trace, TWO_GPU_MODELS, max_awake, sleep_mode, gpus=2)
    check(run, TWO_GPU_MODELS, trace)
    for engine in run.factory.engines:
        assert len(engine.devices) == engine.model.devices


def test_two_users_on_two_models_with_one_resident_engine_both_get_every_answer():
    """The livelock of the first round: each user sends five messages, one after the other."""
    models = [SimulatedModel("a", 15.0), SimulatedModel("b", 15.0)]
    loop_requests = []
    for user in range(2):
        loop_requests += [Request(user * 0.01 + 120.0 * k, user, 200, None) for k in range(5)]
    run = simulate(Trace(loop_requests), models, max_awake=1, sleep_mode=False)
    check(run, models)
    assert all(o.end is not None and o.end.completion_tokens == 200 for o in run.outcomes)
    one_swap = DRAIN_S + 2 * models[0].shutdown_s + 2 * models[0].build_s
    assert max(o.granted - o.started for o in run.outcomes) <= one_swap


def test_a_model_kept_busy_gives_the_gpu_up_after_its_quantum():
    """One model's users keep sending without a pause; another's request still gets its turn."""
    models = [SimulatedModel("busy", 15.0), SimulatedModel("patient", 15.0)]
    flood = [Request(0.5 * k, 0, 40, None) for k in range(600)]
    run = simulate(Trace([Request(0.0, 0, 40, None), *flood, Request(100.0, 1, 40, None)]), models, 1, False)
    patient = run.outcomes[-1]
    assert patient.end is not None
    assert patient.granted - patient.started <= QUANTUM_S + DRAIN_S + 2 * models[0].build_s
    check(run, models)


def test_models_that_fit_together_stay_resident_together_and_sleep_beats_rebuilding():
    small = [SimulatedModel("one", 4.0), SimulatedModel("two", 4.0)]
    alternate = [Request(10.0 * k, k % 2, 50, None) for k in range(20)]
    run = simulate(Trace(alternate), small, max_awake=None, sleep_mode=True)
    assert run.machine.builds == ["one", "two"] and run.machine.wakes == []
    check(run, small)
    swapping = simulate(Trace(alternate), small, max_awake=1, sleep_mode=True)
    assert swapping.machine.builds == ["one", "two"]
    # Every later swap is a wake, not a build; engines are shut down only when the app closes.
    assert len(swapping.machine.wakes) >= 10 and sorted(swapping.machine.shutdowns) == ["one", "two"]
    check(swapping, small)


def test_an_engine_that_took_more_than_its_estimate_is_booked_as_measured():
    """A model sized from a guess takes 48 GB where 27 GB were estimated. Booked by the estimate,
    a second 27 GB model would be built beside it on a 72 GB budget (75 GB in use); booked as
    measured, the first is put to sleep before the second is built."""
    models = [SimulatedModel("guessed", 20.0, actual_gb=48.0), SimulatedModel("known", 20.0)]
    assert models[0].need.per_device + models[1].need.per_device < GPU_BUDGET < 48e9 + models[1].taken
    run = simulate(Trace([Request(0.0, 0, 50, None), Request(300.0, 1, 50, None)]), models, None, True)
    check(run, models)
    assert run.machine.builds == ["guessed", "known"] and run.machine.sleeps == ["guessed"]


def test_a_model_larger_than_the_budget_is_refused_with_a_reason():
    models = [SimulatedModel("giant", 200.0)]
    run = simulate(Trace([Request(0.0, 0, 10, None)]), models, None, True)
    assert run.outcomes[0].error and "cannot be loaded here" in run.outcomes[0].error
    assert run.machine.builds == []


def test_the_policy_evicts_idle_engines_before_busy_ones_and_waits_out_a_quantum():
    need = SimulatedModel("x", 25.0, kv_gb=4).need
    capacity = Capacity((GPU_BUDGET,), host_budget=0)
    idle = Resident("idle", need, (0,), Phase.AWAKE, leases=0, last_used=5.0)
    busy = Resident("busy", need, (0,), Phase.AWAKE, leases=2, last_used=9.0, ready_since=0.0)
    head = Head("new", need, arrived=10.0)
    decision = decide(head, [idle, busy], capacity, quantum_s=30.0, now=11.0)
    assert decision.action == "evict" and [e.key for e in decision.evict] == ["idle"]
    # With only the busy engine in the way, the head waits for the quantum, then drains it.
    waiting = decide(head, [busy], Capacity((need.per_device,)), quantum_s=30.0, now=11.0)
    assert waiting.action == "wait" and waiting.until == 40.0 and waiting.blocking == ("busy",)
    draining = decide(head, [busy], Capacity((need.per_device,)), quantum_s=30.0, now=40.0)
    assert draining.action == "drain" and draining.drain == ("busy",)


def two_sleepers_and_one_in_use(need: MemoryNeed) -> tuple[list[Resident], Resident]:
    """Two sleeping engines and one in use (ready at 0 s, last used at 9 s), all of `need`."""
    asleep = [
        Resident(f"asleep{i}", need, (0,), Phase.ASLEEP, last_used=float(i), can_sleep=True) for i in range(2)
    ]
    busy = Resident("busy", need, (0,), Phase.AWAKE, leases=1, last_used=9.0, ready_since=0.0, can_sleep=True)
    return asleep, busy


def test_making_room_shuts_down_no_sleeping_engine_that_the_room_does_not_need():
    """Draining one engine whose quantum is over makes room for the head; the sleeping engines
    ahead of it in the eviction order stay asleep (shutting one down frees only its residue and
    costs a rebuild later)."""
    need = SimulatedModel("x", 25.0, kv_gb=4).need
    asleep, busy = two_sleepers_and_one_in_use(need)
    budget = need.per_device * 3 // 2 + 2 * need.asleep_per_device
    head = Head("new", need, arrived=10.0)
    decision = decide(head, [*asleep, busy], Capacity((budget,), host_budget=0), quantum_s=30.0, now=40.0)
    assert decision.action == "drain" and decision.drain == ("busy",)
    assert decision.evict == ()


def test_a_victim_the_room_does_not_need_leaves_its_host_memory_to_the_one_it_does():
    """The smaller idle engine would sleep first and take host memory the larger one then lacks;
    the larger one alone makes room, so it sleeps instead of being shut down."""
    gb = 10**9
    small = Resident(
        "small", MemoryNeed(4 * gb, 4 * gb, 3 * GIB, 1), (0,), Phase.AWAKE, 0, 1.0, can_sleep=True
    )
    large = Resident(
        "large", MemoryNeed(40 * gb, 8 * gb, 3 * GIB, 1), (0,), Phase.AWAKE, 0, 5.0, can_sleep=True
    )
    head = Head("new", MemoryNeed(20 * gb, 4 * gb, 3 * GIB, 1), arrived=10.0)
    budget = small.need.per_device + large.need.asleep_per_device + head.need.per_device
    capacity = Capacity((budget,), host_budget=large.need.asleep_host)
    decision = decide(head, [small, large], capacity, quantum_s=30.0, now=11.0)
    assert decision.evict == (Eviction("large", sleep=True),)


def test_the_head_waits_out_a_quantum_rather_than_shut_sleeping_engines_down():
    """Shutting two sleeping engines down would make room now but cost two builds later; the
    engine in use can sleep once its quantum is over, so the head waits for that."""
    need = SimulatedModel("x", 25.0, kv_gb=4).need
    asleep, busy = two_sleepers_and_one_in_use(need)
    capacity = Capacity((2 * need.per_device,), host_budget=10 * need.asleep_host)
    head = Head("new", need, arrived=10.0)
    decision = decide(head, [*asleep, busy], capacity, quantum_s=30.0, now=11.0)
    assert decision.action == "wait" and decision.blocking == ("busy",) and decision.until == 40.0
    later = decide(head, [*asleep, busy], capacity, quantum_s=30.0, now=40.0)
    assert later.action == "drain" and later.drain == ("busy",) and later.evict == ()


def test_a_head_behind_two_busy_models_waits_one_drain_not_their_whole_traffic():
    """Two models kept busy by a stream of requests, a third asked for once: either busy engine
    makes room, and the one being drained stays the one drained (its finished answers must not
    hand the turn to the other, reopening it, over and over while the head waits)."""
    models = [SimulatedModel("x", 25.0), SimulatedModel("y", 25.0), SimulatedModel("h", 25.0)]
    requests = [Request(0.0, 0, 50, None), Request(0.1, 1, 50, None), Request(140.0, 2, 50, None)]
    requests += [Request(60.0 + 3 * k + 0.7 * m, m, 600, None) for k in range(400) for m in (0, 1)]
    run = simulate(Trace(requests), models, None, True)
    head = run.outcomes[2]
    assert head.granted is not None
    one_turn = QUANTUM_S + DRAIN_S + models[0].sleep_s + models[2].build_s + 5.0
    assert head.granted - head.started <= one_turn
    check(run, models)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_scheduling_benchmarks_traces_answer_every_message_within_the_budgets(seed: int):
    """An hour of 16 users on six models (bench/bench_scheduler.py's traces): no answer cut by a
    sleep or a shutdown, no budget exceeded, under the app's policy."""
    trace = bench_scheduler.make_trace(16, 1.0, seed)
    result = bench_scheduler.replay(trace, bench_scheduler.POLICIES[0])
    assert result.errors == 0 and result.violations == 0
    assert len(result.waits) == sum(map(len, trace))


def test_the_states_the_ui_shows_follow_a_sleep_a_wait_a_failed_wake_and_a_rebuild():
    """One engine at a time: "one" sleeps for "two", waits in line behind it, then its wake fails
    and it is rebuilt; the states published on the way are the ones a user should read."""
    models = [SimulatedModel("one", 8.0), SimulatedModel("two", 8.0)]
    loop = VirtualTimeLoop()
    machine = SimulatedMachine((GPU_BUDGET,), host_budget=100 * GIB, clock=loop.time)
    factory = SimulatedFactory(machine, models)
    app_settings = Settings(gpu_count=1, max_resident=1, quantum_s=QUANTUM_S, drain_timeout_s=DRAIN_S)
    manager = EngineManager(simulated_cards(models), app_settings, factory, clock=loop.time)
    seen: list[tuple[str, ModelState, str]] = []
    manager.subscribe(lambda status: seen.append((status.key, status.state, status.phase)))

    async def ask(key: str, tokens: int = 400) -> StreamEnd | None:
        end = None
        async for event in manager.stream(key, MESSAGE, SamplingSettings(max_tokens=tokens)):
            end = event if isinstance(event, StreamEnd) else end
        return end

    async def scenario() -> list[StreamEnd | None]:
        await ask("one")
        long_two = asyncio.create_task(ask("two", 2000))
        await asyncio.sleep(50)  # "two" is built (42 s) and answering
        machine.fail_wakes.add("one")
        ends = [await ask("one"), await long_two]
        await manager.close()
        return ends

    try:
        ends = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert all(end is not None and end.finish_reason == "length" for end in ends)
    one = [(state, phase) for key, state, phase in seen if key == "one"]
    states = [state for state, _ in one]
    assert ModelState.SLEEPING in states
    queued = [phase for state, phase in one if state is ModelState.QUEUED]
    assert any("answer(s) on another model to finish" in phase for phase in queued)
    # What every visitor reads of any model never names another one (blind arena battles).
    names = {key: card.display_name for key, card in simulated_cards(models).items()}
    for key, _, phase in seen:
        assert not any(name in phase for other, name in names.items() if other != key), phase
    loading = [phase for state, phase in one if state is ModelState.LOADING]
    assert "waking from sleep" in loading and "waking failed; rebuilding" in loading
    assert machine.builds == ["one", "two", "one"] and machine.violations == []
    assert not machine.live
