"""The browser app: one page, a view per tab, over services every view shares.

- `services`: the catalog as offered here, the engine manager, the steps from a message to a
  measured reply (`Playground`).
- `chat`, `compare`: a tab each, its layout and its handlers (a button's handler is in the
  view that shows the button). `api`: the `/chat` endpoint.
- `widgets`: controls several views use. `page`: the page around the views (tabs, sessions
  that survive a reload, the public server's defaults).

This package imports neither torch nor vLLM: the engine factory is given to the manager by
`app.__main__`. May import: every layer below it (`app.demo`, `app.domain`, `app.storage`,
`app.engines`, `app.media`, `app.catalog`, `app.config`); checked by `make lint`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.views.page import build, launch
    from app.views.services import Playground

__all__ = ["Playground", "build", "launch"]
# Imported on first use, not with the package: `python -m app add-user` needs `accounts` only,
# and Gradio's import took 6.9 s of its 8.5.
_HOMES = {"Playground": "app.views.services", "build": "app.views.page", "launch": "app.views.page"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
