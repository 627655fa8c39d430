"""Twins of models whose processor (and often config) the installed vLLM carries itself."""

from __future__ import annotations

from app.twins.common import Builder

BUILDERS: dict[str, Builder] = {}

WHY_NOT: dict[str, str] = {}
