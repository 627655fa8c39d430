"""The golden file the catalog tests read (`tests/golden/references.json`) says what the
reference examples really do: where the seeds are at hand, every call and fact in it is run
again against them and must be equal. A clone without the seeds skips this and still passes
the catalog tests from the golden file."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest
import references as ref

seeds = pytest.importorskip("reference_scripts")
if not seeds.SEEDS_DIR.is_dir():
    pytest.skip(f"the reference seeds are not at {seeds.SEEDS_DIR}", allow_module_level=True)


def entries(kind: str) -> list[tuple[str, Any]]:
    return sorted(ref.golden()[kind].items())


@pytest.mark.parametrize(("call", "stored"), entries("calls"), ids=lambda v: str(v)[:60])
def test_each_recorded_call_is_what_the_reference_does(call: str, stored: Any):
    name, *args = json.loads(call)
    assert ref.plain(asdict(getattr(seeds, name)(*args))) == stored, ref.REGENERATE


@pytest.mark.parametrize(("fact", "stored"), entries("facts"), ids=lambda v: str(v)[:60])
def test_each_recorded_fact_is_what_the_references_say(fact: str, stored: Any):
    name, *args = json.loads(fact)
    assert ref.plain(getattr(seeds, name)(*args)) == stored, ref.REGENERATE


def test_the_golden_file_has_every_reference_key():
    assert sorted(ref.all_reference_keys()) == sorted(seeds.all_reference_keys())
