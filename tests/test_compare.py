"""Comparisons: who runs side by side and who waits, and what an export holds."""

from __future__ import annotations

import json

from app.compare import Column, Comparison, to_json, to_markdown
from app.engine import SamplingSettings


def test_exports_hold_prompts_repositories_settings_answers_and_timings():
    comparison = Comparison("Which is bigger?", ["shapes.png"], "Be brief.", SamplingSettings(seed=3))
    comparison.columns = [
        Column(
            "a",
            "Model A",
            "org/a",
            "abc123",
            state="done",
            answer="The circle.",
            prompt="<p>A</p>",
            prompt_tokens=80,
            completion_tokens=4,
            ttft_s=0.05,
            tokens_per_s=70.0,
        ),
        Column("b", "Model B", "org/b", None, state="failed", error="Model B could not be loaded: no GPU"),
    ]
    data = json.loads(to_json(comparison))
    assert data["sampling"]["seed"] == 3 and data["system"] == "Be brief."
    assert [c["hf_repo"] for c in data["columns"]] == ["org/a", "org/b"]
    assert data["columns"][0]["prompt"] == "<p>A</p>" and data["columns"][0]["revision"] == "abc123"
    markdown = to_markdown(comparison)
    assert "## Model A" in markdown and "org/a (revision abc123)" in markdown
    assert "Time to first token: n/a" in markdown.split("## Model B")[1]
    assert "0.05 s" in markdown and "70.0" in markdown and "The circle." in markdown
    assert "failed: Model B could not be loaded: no GPU" in markdown
