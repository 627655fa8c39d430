"""Twins of the InternVL family (remote-code configs; vLLM carries the processors)."""

from __future__ import annotations

from app.twins.common import Builder

BUILDERS: dict[str, Builder] = {}

WHY_NOT: dict[str, str] = {}
