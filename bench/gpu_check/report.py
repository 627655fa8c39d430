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
