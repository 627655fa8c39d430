"""A visitor's identity is the server's word (`app.views.identity`): a signed, HttpOnly cookie
issued by a middleware in front of a real ASGI app, and the client's address as the connection
(or a trusted proxy) says. Forged, stale or missing cookies make a new visitor."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ports import free_port
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app.catalog.cards import load_cards
from app.config import Settings, SettingsError
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import History, sqlite_url
from app.views import Playground, launch
from app.views.identity import CLIENT_KEY, COOKIE, Identity, IdentityMiddleware, signing_key
from app.views.page import Page

IDENTITY = Identity(secrets.token_bytes(32), trusted_proxies=("10.9.9.9",))


def whoami(request: Request) -> PlainTextResponse:
    return PlainTextResponse(IDENTITY.visitor(request.headers) or "nobody")


def client() -> TestClient:
    app = Starlette(
        routes=[Route("/", whoami)], middleware=[Middleware(IdentityMiddleware, identity=IDENTITY)]
    )
    return TestClient(app)


def test_a_new_visitor_gets_a_signed_http_only_cookie_that_names_them_from_the_first_request():
    browser = client()
    first = browser.get("/")
    cookie = first.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    visitor = first.text
    assert len(visitor) == 32 and visitor != "nobody"
    again = browser.get("/")
    assert again.text == visitor and "set-cookie" not in again.headers  # kept, not reissued


def test_a_forged_or_picked_id_is_never_taken():
    picked = "0" * 32
    for forged in (picked, f"{picked}.{'f' * 32}", f"{picked}.", "x" * 500):
        browser = client()
        browser.cookies.set(COOKIE, forged)
        answer = browser.get("/")
        assert answer.text != picked and len(answer.text) == 32, forged
        assert COOKIE in answer.headers["set-cookie"]


@given(value=st.text(max_size=80))
def test_only_what_this_server_signed_verifies(value: str):
    assert IDENTITY.verify(value) is None or IDENTITY.sign(IDENTITY.verify(value) or "") == value
    assert Identity(secrets.token_bytes(32)).verify(IDENTITY.sign("a" * 32)) is None


def test_the_address_is_the_peers_unless_a_trusted_proxy_forwarded_it():
    assert IDENTITY.address("203.0.113.5", "198.51.100.1") == "203.0.113.5"  # not a trusted proxy
    assert IDENTITY.address("10.9.9.9", "198.51.100.1") == "198.51.100.1"
    # A client's own X-Forwarded-For entries come first: the proxy's last one is believed.
    assert IDENTITY.address("10.9.9.9", "1.2.3.4, 198.51.100.1") == "198.51.100.1"
    assert IDENTITY.address("10.9.9.9", "198.51.100.1, 10.9.9.9") == "198.51.100.1"
    assert IDENTITY.address_key("198.51.100.1") != "198.51.100.1"
    # A proxy that writes the client's port: the client, not one per port.
    assert IDENTITY.address("10.9.9.9", "198.51.100.1:5678") == "198.51.100.1"
    assert IDENTITY.address("10.9.9.9", "[2001:db8::7]:443, 10.9.9.9:80") == "2001:db8::/64"


def test_a_handler_counts_the_client_the_door_counted_and_its_headers_where_no_door_stood():
    """The door works the client key out once per request and keeps it in the request's scope;
    the handlers (a page's load, `/chat`) read it there. A request no door saw (an app mounted
    without one) is worked out from its peer and X-Forwarded-For lines as the door would."""

    def scope(client: str, forwarded: list[str], **kept: str) -> dict:
        headers = [(b"x-forwarded-for", line.encode()) for line in forwarded]
        return {"type": "http", "method": "POST", "headers": headers, "client": (client, 5000), **kept}

    kept = gr.Request(request=Request(scope("10.9.9.9", ["198.51.100.1"], **{CLIENT_KEY: "192.0.2.44"})))
    assert IDENTITY.client_of(kept) == "192.0.2.44"
    # Two lines from two proxies read as one list: the last hop not a trusted proxy.
    unseen = gr.Request(request=Request(scope("10.9.9.9", ["1.2.3.4", "198.51.100.1, 10.9.9.9"])))
    assert IDENTITY.client_of(unseen) == "198.51.100.1"
    assert IDENTITY.client_of(gr.Request(request=Request(scope("2001:db8::9", [])))) == "2001:db8::/64"
    assert IDENTITY.client_of(None) == "unknown"


def test_trusted_proxies_may_be_ranges():
    """A hosted proxy (a Space's) answers from a pool of addresses: listed one by one, a request
    from another of them counted every visitor as that proxy (one vote limit for all)."""
    pool = Identity(secrets.token_bytes(32), trusted_proxies=("10.16.0.0/12", "fd00::/8", "192.0.2.7"))
    assert pool.address("10.20.30.40", "198.51.100.1") == "198.51.100.1"
    assert pool.address("10.20.30.40", "198.51.100.1, 10.31.0.1") == "198.51.100.1"
    assert pool.address("fd00::1", "2001:db8::5") == "2001:db8::/64"  # an IPv6 client: its /64
    assert pool.address("192.0.2.7", "198.51.100.1") == "198.51.100.1"
    assert pool.address("10.32.0.1", "198.51.100.1") == "10.32.0.1"  # outside the range
    assert pool.address("not an address", "198.51.100.1") == "not an address"
    with pytest.raises(SettingsError, match=r"APP_TRUSTED_PROXIES.*10\.0\.0\.300"):
        Settings.from_env({"APP_TRUSTED_PROXIES": "10.0.0.1, 10.0.0.300"})


def test_a_proxy_on_the_hosts_own_network_not_listed_as_trusted_is_named_in_the_log_once(caplog):
    """Behind a reverse proxy not in APP_TRUSTED_PROXIES every visitor has the proxy's address and
    shares one allowance; the operator is told which address to list, once. A peer from the
    public internet that sends the header is a client writing its own, and says nothing."""
    untrusted = Identity(secrets.token_bytes(32))
    with caplog.at_level("WARNING", logger="app.views.identity"):
        assert untrusted.address("203.0.113.5", "198.51.100.1") == "203.0.113.5"
        assert IDENTITY.address("10.9.9.9", "198.51.100.1") == "198.51.100.1"  # trusted
        assert untrusted.address("127.0.0.1", None) == "127.0.0.1"  # no header: no proxy
        assert not caplog.records
        for _ in range(3):
            assert untrusted.address("127.0.0.1", "198.51.100.1") == "127.0.0.1"
        untrusted.address("192.168.1.2", "198.51.100.1")
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    line = caplog.records[0].getMessage()
    assert "127.0.0.1" in line and "APP_TRUSTED_PROXIES" in line and "198.51.100.1" not in line


def test_the_signing_key_outlives_a_restart_and_is_the_apps_alone(tmp_path):
    first = signing_key(tmp_path)
    assert signing_key(tmp_path) == first and len(first) == 32
    assert (tmp_path / "visitor-key").stat().st_mode & 0o077 == 0


# --- the real page -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Page, str]]:
    """The app's own page, launched as `python -m app` launches it (no model is asked for)."""
    settings = Settings(gpu_count=0, port=free_port())
    manager = EngineManager(load_cards(), settings, VllmEngineFactory(settings))
    decoder = VideoDecoderPool(workers=1)
    folder = tmp_path_factory.mktemp("identity")
    history = History(sqlite_url(folder), folder / "media")
    page = Page(Playground(manager, settings, decoder, history))
    demo = launch(page.build(), settings, block=False, quiet=True)
    yield page, f"http://127.0.0.1:{settings.port}/"
    demo.close()
    history.close()
    decoder.close()


def loaded(page: Page, cookie: str | None, picked: str, peer: str = "203.0.113.9") -> tuple[str, str]:
    """What the page's load handler makes of a request: the tab's token and the visitor's id. The
    page's script hands it `picked`, the id it keeps in localStorage (a script writes what it likes)."""
    headers = [(b"x-forwarded-for", b"198.51.100.1")]
    if cookie is not None:
        headers.append((b"cookie", f"{COOKIE}={cookie}".encode()))
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "client": (peer, 5000)}
    request = gr.Request(request=Request(scope), session_hash=secrets.token_hex(8))
    token, browser, *_ = asyncio.run(page.resume("", picked, request, None))
    return token, browser


def test_the_served_page_issues_the_cookie_and_its_load_believes_only_the_cookie(served):
    page, url = served
    first = httpx.get(url)
    assert first.status_code == 200
    issued = first.headers["set-cookie"]
    assert issued.startswith(f"{COOKIE}=") and "HttpOnly" in issued and "SameSite=Lax" in issued
    assert "Secure" not in issued  # plain http here: a Secure cookie would never come back
    value = first.cookies[COOKIE]
    again = httpx.get(url, cookies={COOKIE: value})
    assert again.status_code == 200 and "set-cookie" not in again.headers
    visitor = page.playground.identity.verify(value)
    assert visitor is not None
    # The id the page's script offers is shown back the server's, never taken.
    picked = "0" * 32
    token, browser = loaded(page, value, picked)
    assert browser == visitor
    assert loaded(page, value, picked)[1] == visitor  # another tab of the same browser
    assert page.sessions.visits[token].address == "203.0.113.9"  # no trusted proxy: the peer's
    # No cookie, or a forged one: a new visitor every time, never the picked id.
    strangers = {loaded(page, cookie, picked)[1] for cookie in (None, None, f"{picked}.{'f' * 32}")}
    assert len(strangers) == 3 and picked not in strangers and visitor not in strangers


def test_the_cookie_is_secure_where_the_public_address_is_https_and_cross_site_only_in_a_spaces_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Over https the cookie is `Secure`. On a Space it is also sent inside another site's frame
    (`SameSite=None`): huggingface.co frames the app at its own hf.space address, where a browser
    keeps no `Lax` cookie (each reload was a new visitor, with no history and a fresh vote
    limit). There every response says that only huggingface.co and the page itself may frame it,
    so no other site can show the page with the visitor's cookie (a hostile review of the first
    version: `None` everywhere let any site frame it and have the visitor click). On a Space the
    proxy's private address is trusted to name the visitor (10.16.3.80 was seen)."""
    decoder = VideoDecoderPool(workers=1)

    def identity_of(settings: Settings) -> Identity:
        manager = EngineManager(load_cards(), settings, VllmEngineFactory(settings))
        return Playground(manager, settings, decoder, None).identity

    try:
        https = identity_of(Settings(gpu_count=0, public_url="https://vlm.example.org"))
        header = https.cookie_header("a" * 32)
        assert b"; Secure" in header and b"SameSite=Lax" in header and https.frame_ancestors is None
        assert https.address("10.16.3.80", "198.51.100.1") == "10.16.3.80"  # no proxy trusted
        monkeypatch.setenv("SPACE_HOST", "someone-vlm.hf.space")
        space = identity_of(Settings(gpu_count=0))
        header = space.cookie_header("a" * 32)
        assert b"; Secure" in header and b"SameSite=None" in header and b"SameSite=Lax" not in header
        assert space.frame_ancestors == b"frame-ancestors 'self' https://huggingface.co"
        assert space.address("10.16.3.80", "203.0.113.4, 198.51.100.1") == "198.51.100.1"
        assert space.address("198.51.100.9", "203.0.113.4") == "198.51.100.9"  # not the proxy
        app = Starlette(routes=[Route("/", lambda _: PlainTextResponse("page"))])
        framed = TestClient(IdentityMiddleware(app, space)).get("/")
        assert framed.headers["content-security-policy"] == "frame-ancestors 'self' https://huggingface.co"
        plain = TestClient(IdentityMiddleware(app, https)).get("/")
        assert "content-security-policy" not in plain.headers
    finally:
        decoder.close()
