"""`/metrics` for an operator's Prometheus (`APP_METRICS`, off unless asked): the manager's metrics
(`app.engines.metrics`), the visitors connected, and vLLM's own (`vllm:*`) beside them.

vLLM registers its metrics in prometheus_client's default registry, and a new engine replaces
the last one's there (vLLM unregisters them first): with several engines in one process, the
`vllm:*` lines are those of the engine built last.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from app.domain.sessions import SessionStore

PATH = "/metrics"
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


class Visitors(Collector):
    """Tabs with a page open now, and the browsers (or accounts) behind them."""

    def __init__(self, sessions: SessionStore) -> None:
        self.sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        open_visits = [visit for visit in list(self.sessions.visits.values()) if visit.pages]
        yield GaugeMetricFamily("vlm_open_tabs", "Tabs with the page open", value=len(open_visits))
        yield GaugeMetricFamily(
            "vlm_visitors",
            "Browsers or accounts with a tab open",
            value=len({v.browser_id for v in open_visits}),
        )


def exposition(registry: CollectorRegistry) -> bytes:
    """The app's metrics, then vLLM's (and the process's) from the default registry."""
    return generate_latest(registry) + generate_latest(REGISTRY)


class MetricsEndpoint:
    """Answers GET `/metrics` in front of Gradio (which would route it to the page)."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        body = exposition(self.registry)
        headers = [(b"content-type", CONTENT_TYPE_LATEST.encode()), (b"cache-control", b"no-store")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
