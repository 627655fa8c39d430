"""The summary of a run (dry run or engine check): markdown on stdout, and in `--out` the report
as JSON (or the markdown where the name ends in `.md`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .common import log


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [f"## GPU check, {report['mode']} ({meta['date']})", ""]
    for key in ("command", "gpu", "gpu_memory_gib", "driver", "vllm", "torch", "torch_cuda", "transformers"):
        if meta.get(key) is not None:
            lines.append(f"- {key}: `{meta[key]}`")
    lines.append("")
    if report.get("phases"):
        lines += [*summary_table(report), ""]
    lines += ["| model | parameters | weights | gpu_memory_utilization |", "| --- | --- | --- | --- |"]
    for model in report["models"].values():
        util = model.get("gpu_memory_utilization", "")
        lines.append(f"| {model['title']} | {model['parameters']:,} | {model['weights_gib']} GiB | {util} |")
    for name, phase in report.get("phases", {}).items():
        lines += ["", f"### {name}", ""]
        if phase.get("error"):
            lines.append(f"phase failed: {phase['error']}")
        steps = phase.get("steps", {})
        if steps:
            lines += ["| step | result |", "| --- | --- |"]
            for step, entry in steps.items():
                lines.append(f"| {step} | {_cell(entry)} |")
        notes = {k: v for k, v in phase.items() if k not in ("steps", "checks", "error", "traceback")}
        for key, value in notes.items():
            lines.append(f"- {key}: `{json.dumps(value)}`")
    if "memory" in report:
        lines += ["", "### GPU memory, start and end", ""]
        for key, value in report["memory"].items():
            lines.append(f"- {key}: `{json.dumps(value)}`")
    lines += ["", "### Checks", "", "| check | verdict | detail |", "| --- | --- | --- |"]
    for check in report["checks"]:
        detail = str(check["detail"]).replace("|", "/")
        lines.append(f"| {check['name']} | {'ok' if check['ok'] else 'FAILED'} | {detail} |")
    lines += ["", f"**{'All checks passed.' if report['ok'] else 'Some checks FAILED.'}**"]
    return "\n".join(lines) + "\n"


def summary_table(report: dict[str, Any]) -> list[str]:
    """The figures docs/BENCHMARKS.md records, as a table to paste: each model's build, rebuild,
    sleep and wake, what sleep freed, its footprint against the expected one, and a swap by
    sleep against a swap by rebuild. A dash where a step did not run or failed."""
    phases = report["phases"]
    roles = [role for role in ("small", "large") if f"lifecycle_{role}" in phases]
    titles = [report["models"][role]["title"] for role in roles]

    def step(role: str, name: str, key: str = "seconds") -> Any:
        return phases[f"lifecycle_{role}"].get("steps", {}).get(name, {}).get(key)

    def footprint(role: str) -> str:
        seen = phases[f"lifecycle_{role}"].get("footprint_against_expected")
        return f"{seen['measured_gib']} / {seen['expected_gib']}" if seen else "-"

    rows = [
        ("weights", [report["models"][role].get("weights", "dummy") for role in roles]),
        ("build (cold), s", [step(role, "build") for role in roles]),
        ("rebuild (warm), s", [step(role, "rebuild") for role in roles]),
        ("sleep (level 1), s", [step(role, "sleep (level 1)") for role in roles]),
        ("wake, s", [step(role, "wake") for role in roles]),
        ("freed by sleep, GiB", [step(role, "sleep (level 1)", "freed_gib") for role in roles]),
        ("GPU memory taken, measured / expected, GiB", [footprint(role) for role in roles]),
    ]
    lines = ["| | " + " | ".join(titles) + " |", "| --- |" + " --- |" * len(titles)]
    lines += [f"| {name} | " + " | ".join(_figure(v) for v in values) + " |" for name, values in rows]
    sleep = phases.get("swaps_sleep", {}).get("median_s", {})
    build = phases.get("swaps_build", {}).get("median_s", {})
    by_sleep = sleep["sleep"] + sleep["wake"] if {"sleep", "wake"} <= set(sleep) else None
    by_build = build["shutdown"] + build["build"] if {"shutdown", "build"} <= set(build) else None
    lines += [
        "",
        f"A swap by sleep and wake (median): {_figure(by_sleep)} s; by shutdown and rebuild (median): "
        f"{_figure(by_build)} s" + (f" ({by_build / by_sleep:.1f}x)." if by_sleep and by_build else "."),
    ]
    return lines


def _figure(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _cell(entry: dict[str, Any]) -> str:
    if "skipped" in entry:
        return f"skipped: {entry['skipped']}"
    if "error" in entry:
        return f"FAILED after {entry.get('seconds')} s: {entry['error']}".replace("|", "/")
    extras = {k: v for k, v in entry.items() if k != "seconds"}
    text = f"{entry['seconds']:.2f} s"
    return text + (f" {json.dumps(extras)}".replace("|", "/") if extras else "")


def write_report(report: dict[str, Any], out: Path | None) -> None:
    text = markdown(report)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text if out.suffix == ".md" else json.dumps(report, indent=2, default=str) + "\n")
        log(f"wrote {out}")
