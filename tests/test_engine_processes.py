"""The tests' engine processes (`tests/engine_processes.py`) compute as fast as a model's numbers
allow: vLLM's random weights (`load_format="dummy"`, values of about 1e-3) shrink a deep tower's
activations below float32's normal range, and a CPU computes on such subnormal numbers some fifty
times slower (Gemma 3n's MobileNet-V5 twin: 89 s a picture against 1.5 s, one thread)."""

from __future__ import annotations

from typing import Any


def smallest_product(results: Any) -> None:
    import torch

    results.put(float(torch.tensor([1e-39]) * torch.tensor([1.0])))


def test_an_engine_process_reads_subnormal_numbers_as_zero():
    from engine_processes import CONTEXT

    results = CONTEXT.Queue()
    process = CONTEXT.Process(target=smallest_product, args=(results,))
    process.start()
    try:
        assert results.get(timeout=120) == 0.0
    finally:
        process.join(30)
