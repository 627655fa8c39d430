"""A visitor's identity is the server's word (`app.views.identity`): a signed, HttpOnly cookie
issued by a middleware in front of a real ASGI app, and the client's address as the connection
(or a trusted proxy) says. Forged, stale or missing cookies make a new visitor."""

from __future__ import annotations

import secrets

from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app.views.identity import COOKIE, Identity, IdentityMiddleware, signing_key

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


def test_the_signing_key_outlives_a_restart_and_is_the_apps_alone(tmp_path):
    first = signing_key(tmp_path)
    assert signing_key(tmp_path) == first and len(first) == 32
    assert (tmp_path / "visitor-key").stat().st_mode & 0o077 == 0
