"""Optional sign-in (`app.views.accounts`, `APP_SIGN_IN`): a signed-in visitor's history and votes
belong to the account on every browser; only a trusted proxy names the account in a header;
passwords are kept as salted hashes and checked by Gradio's own login page; the arena can take
votes from signed-in visitors only. The served page is driven in Chromium, each browser context
a separate device (its own cookies)."""

from __future__ import annotations

import os
import re
import secrets
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gradio as gr
import pytest
from playwright.sync_api import Browser, Page
from ports import free_port
from starlette.requests import Request

from app.catalog.cards import load_cards
from app.config import Settings, SettingsError
from app.domain.sessions import Visit
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import ConversationRecord, History, TurnRecord, new_id, sqlite_url
from app.views import Playground, launch
from app.views.accounts import (
    AccountError,
    PasswordCheck,
    SignIn,
    account_id,
    add_user,
    password_matches,
    read_users,
)
from app.views.page import Page as AppPage

ROOT = Path(__file__).resolve().parent.parent
PASSWORDS = {"alice": "correct horse battery", "bob": "staple of the stable"}


# --- accounts and passwords ------------------------------------------------------------------------


def test_a_password_is_kept_as_a_salted_hash_and_checked_as_one(tmp_path: Path):
    users = tmp_path / "users"
    add_user(users, "alice", PASSWORDS["alice"])
    add_user(users, "bob", PASSWORDS["bob"])
    text = users.read_text()
    assert PASSWORDS["alice"] not in text and text.count("scrypt$") == 2
    assert stat.S_IMODE(users.stat().st_mode) == 0o600
    stored = read_users(users)
    assert password_matches(PASSWORDS["alice"], stored["alice"])
    assert not password_matches(PASSWORDS["bob"], stored["alice"])
    # The same password twice gives two hashes (salted), and a changed password replaces the old.
    add_user(users, "carol", PASSWORDS["bob"])
    assert read_users(users)["carol"] != read_users(users)["bob"]
    add_user(users, "alice", "a new password")
    check = PasswordCheck(read_users(users))
    assert check("alice", "a new password") and not check("alice", PASSWORDS["alice"])
    assert not check("mallory", PASSWORDS["bob"]) and not check("", "")


@pytest.mark.parametrize(
    "text",
    ["alice:hunter2\n", "alice\n", "../etc:scrypt$1$2$3$4$5\n", "# only a comment\n", ""],
)
def test_a_users_file_with_a_plain_password_or_a_bad_line_is_refused(tmp_path: Path, text: str):
    users = tmp_path / "users"
    users.write_text(text)
    with pytest.raises(AccountError, match="add-user") as refused:
        read_users(users)
    assert "hunter2" not in str(refused.value)


def test_a_users_file_that_is_refused_stops_the_app_at_start(tmp_path: Path):
    """One bad file is enough here: every refusal above is the same AccountError, which the app
    turns into one line and exit code 2 (about 10 s a start of the app on two busy cores)."""
    users = tmp_path / "users"
    users.write_text("alice:hunter2\n")
    started = subprocess.run(
        [sys.executable, "-m", "app", "--sign-in", "password", "--users-file", str(users), "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 2
    assert started.stderr.startswith("error: APP_USERS_FILE") and "Traceback" not in started.stderr
    assert "hunter2" not in started.stderr


def test_add_user_writes_an_account_from_standard_input(tmp_path: Path):
    users = tmp_path / "users"
    added = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "app", "add-user", "alice", "--users-file", str(users)],
        cwd=ROOT,
        input=PASSWORDS["alice"] + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert added.returncode == 0, added.stderr
    # Without the page's libraries: importing Gradio took 6.9 s of the command's 8.5.
    assert not re.search(r"\|\s*gradio$", added.stderr, re.MULTILINE), "add-user imported Gradio"
    assert PasswordCheck(read_users(users))("alice", PASSWORDS["alice"])
    short = subprocess.run(
        [sys.executable, "-m", "app", "add-user", "bob", "--users-file", str(users)],
        cwd=ROOT,
        input="short\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert short.returncode == 2 and short.stderr == "error: a password has at least 8 characters\n"


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"APP_SIGN_IN": "proxy"}, "APP_SIGN_IN=proxy needs APP_TRUSTED_PROXIES"),
        ({"APP_SIGN_IN": "password"}, "APP_SIGN_IN=password needs APP_USERS_FILE"),
        ({"APP_ARENA_SIGNED_IN_ONLY": "1"}, "APP_ARENA_SIGNED_IN_ONLY needs a way to sign in"),
        ({"APP_SIGN_IN": "saml"}, "APP_SIGN_IN='saml': write off, huggingface, proxy or password"),
        (
            {"APP_SIGN_IN": "proxy", "APP_TRUSTED_PROXIES": "10.0.0.1", "APP_SIGN_IN_HEADER": "X User"},
            "APP_SIGN_IN_HEADER='X User': write a header name",
        ),
    ],
)
def test_a_way_of_signing_in_without_what_it_needs_is_refused_in_one_line(env: dict[str, str], said: str):
    with pytest.raises(SettingsError) as refused:
        Settings.from_sources(env)
    assert str(refused.value).startswith(said)


def test_only_a_trusted_proxy_names_the_account_and_only_with_a_plain_name():
    sign_in = SignIn("proxy", "X-Forwarded-User", trusted_proxies=("10.0.0.1",))
    named = sign_in.account("10.0.0.1", {"x-forwarded-user": "alice"}, None, None)
    assert named is not None and named.name == "alice" and named.visitor == account_id("proxy", "alice")
    # The same header straight from a visitor is theirs to write: not believed.
    assert sign_in.account("203.0.113.9", {"x-forwarded-user": "alice"}, None, None) is None
    for bad in ("", " ", "../alice", "alice\nbob", "a" * 200, "<b>alice</b>"):
        assert sign_in.account("10.0.0.1", {"x-forwarded-user": bad}, None, None) is None
    # Gradio's own login (password) and the Hugging Face profile are read in their modes only.
    assert SignIn("password").account("203.0.113.9", {"x-forwarded-user": "alice"}, None, None) is None
    assert SignIn("password").account(None, {}, "bob", None).visitor == account_id("password", "bob")
    assert SignIn("huggingface").account(None, {}, "bob", "carol").name == "carol"
    assert SignIn("off").account("10.0.0.1", {"x-forwarded-user": "alice"}, "bob", "carol") is None
    # An account's id is never an anonymous visitor's (those are random) nor another provider's.
    assert account_id("proxy", "alice") != account_id("password", "alice")


# --- the served page ------------------------------------------------------------------------------


def serve(settings: Settings, folder: Path) -> tuple[Callable[[], None], History, AppPage]:
    manager = EngineManager(load_cards(), settings, VllmEngineFactory(settings))
    decoder = VideoDecoderPool(workers=1)
    history = History(sqlite_url(folder), folder / "media")
    page = AppPage(Playground(manager, settings, decoder, history))
    demo = launch(page.build(), settings, block=False, quiet=True)

    def close() -> None:
        demo.close()
        history.close()
        decoder.close()

    return close, history, page


def stored_chat(history: History, visitor: str, title: str) -> None:
    record = ConversationRecord(id=new_id(), title=title, model="demo_seeing", turns=[TurnRecord(text=title)])
    history.save(visitor, record)


def history_titles(page: Page) -> list[str]:
    page.wait_for_function(
        "/^(Signed in|Not signed in)/.test(document.querySelector('#signed-in')?.innerText)"
    )
    page.wait_for_timeout(1_000)  # the list fills after the load
    return page.locator("#history-list label").all_inner_texts()


@pytest.mark.slow
def test_behind_a_proxy_the_account_header_carries_history_across_devices(browser: Browser, tmp_path: Path):
    # Chromium connects from 127.0.0.1, the proxy here; the header is what the proxy sets.
    port = free_port()
    settings = Settings(gpu_count=0, port=port, sign_in="proxy", trusted_proxies=("127.0.0.1",))
    close, history, _ = serve(settings, tmp_path)
    try:
        stored_chat(history, account_id("proxy", "alice"), "Alice's shapes")
        stored_chat(history, account_id("proxy", "bob"), "Bob's clip")
        seen: dict[str, list[str]] = {}
        for device, user in [("laptop", "alice"), ("phone", "alice"), ("desk", "bob"), ("none", None)]:
            headers = {"X-Forwarded-User": user} if user else {}
            context = browser.new_context(extra_http_headers=headers)
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"http://127.0.0.1:{port}/")
            titles = history_titles(page)  # once the load has said who signed in
            seen[device] = [page.locator("#signed-in").inner_text(), *titles]
            context.close()
        assert (
            seen["laptop"]
            == seen["phone"]
            == ["Signed in as alice: your history and votes follow you."]
            + [title for title in seen["laptop"][1:] if "Alice" in title]
        )
        assert any("Alice's shapes" in title for title in seen["phone"])
        assert not any("Bob" in title for title in seen["laptop"])
        assert seen["desk"][0].startswith("Signed in as bob") and any("Bob's clip" in t for t in seen["desk"])
        assert seen["none"][0] == "Not signed in: your history stays with this browser."
        assert not any("Alice" in title or "Bob" in title for title in seen["none"][1:])
    finally:
        close()


@pytest.mark.slow
def test_with_passwords_gradios_login_page_signs_in_and_the_account_keeps_its_history(
    browser: Browser, tmp_path: Path
):
    users = tmp_path / "users"
    for name, password in PASSWORDS.items():
        add_user(users, name, password)
    port = free_port()
    settings = Settings(gpu_count=0, port=port, sign_in="password", users_file=users)
    close, history, _ = serve(settings, tmp_path)
    try:
        stored_chat(history, account_id("password", "alice"), "Alice's shapes")

        def sign_in(name: str, password: str) -> Page:
            page = browser.new_context().new_page()
            page.set_default_timeout(60_000)
            page.goto(f"http://127.0.0.1:{port}/")
            page.locator("input[type=text]").first.fill(name)
            page.locator("input[type=password]").fill(password)
            page.keyboard.press("Enter")
            return page

        refused = sign_in("alice", PASSWORDS["bob"])
        refused.wait_for_selector("text=Incorrect Credentials")
        assert refused.locator("#chat-input").count() == 0
        refused.context.close()
        titles = {}
        for name in PASSWORDS:
            page = sign_in(name, PASSWORDS[name])
            page.wait_for_selector("#chat-input textarea")
            titles[name] = history_titles(page)
            assert page.locator("#signed-in").inner_text().startswith(f"Signed in as {name}")
            page.context.close()
        assert any("Alice's shapes" in title for title in titles["alice"])
        assert not any("Alice" in title for title in titles["bob"])
    finally:
        close()


def test_an_arena_for_signed_in_visitors_refuses_an_anonymous_vote_in_one_line(tmp_path: Path, loop):
    settings = Settings(
        gpu_count=0, sign_in="proxy", trusted_proxies=("10.0.0.1",), arena_signed_in_only=True
    )
    manager = EngineManager(load_cards(), settings, VllmEngineFactory(settings))
    decoder = VideoDecoderPool(workers=1)
    history = History(sqlite_url(tmp_path), tmp_path / "media")
    try:
        page = AppPage(Playground(manager, settings, decoder, history))
        assert page.arena is not None
        anonymous = Visit(browser_id=secrets.token_hex(16))
        notice = loop.run(page.arena.vote("A", "", anonymous))[2]  # the heads, then the notice
        assert "Sign in to vote" in notice
        signed_in = Visit(browser_id=account_id("proxy", "alice"), account="alice")
        notice = loop.run(page.arena.vote("A", "", signed_in))[2]
        assert "Sign in" not in notice and "Send a message first" in notice  # on to the next check
    finally:
        history.close()
        decoder.close()


def test_hugging_face_sign_in_off_a_space_is_refused_in_one_line():
    started = subprocess.run(
        [sys.executable, "-m", "app", "--sign-in", "huggingface", "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SYSTEM": ""},
    )
    assert started.returncode == 2
    assert started.stderr.startswith("error: APP_SIGN_IN=huggingface works on a Hugging Face Space")


def test_hugging_face_sign_in_shows_its_button_and_takes_the_profiles_user_name(
    tmp_path: Path, loop, monkeypatch: pytest.MonkeyPatch
):
    """The OAuth round trip itself needs huggingface.co (a Space with `hf_oauth: true`), which
    this machine cannot reach: here, on a Space's environment, the page offers Gradio's button and
    its routes, and a profile Gradio hands the load event makes the account."""
    # What a Space with `hf_oauth: true` sets (Gradio reads the OAuth values at import).
    monkeypatch.setenv("SYSTEM", "spaces")
    monkeypatch.setenv("SPACE_ID", "someone/vlm-playground")
    for name, value in {
        "OAUTH_CLIENT_ID": "client",
        "OAUTH_CLIENT_SECRET": "secret",
        "OAUTH_SCOPES": "openid profile",
        "OPENID_PROVIDER_URL": "https://huggingface.co",
    }.items():
        monkeypatch.setattr(gr.oauth, name, value)
    settings = Settings(gpu_count=0, sign_in="huggingface")
    manager = EngineManager(load_cards(), settings, VllmEngineFactory(settings))
    decoder = VideoDecoderPool(workers=1)
    try:
        page = AppPage(Playground(manager, settings, decoder, None))
        demo = page.build()
        assert demo.expects_oauth
        routes = {getattr(route, "path", "") for route in demo.app.routes}
        assert {"/login/huggingface", "/login/callback", "/logout"} <= routes
        scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "client": ("203.0.113.9", 1)}
        request = gr.Request(request=Request(scope), session_hash=secrets.token_hex(8))
        profile = gr.OAuthProfile(
            {"preferred_username": "carol", "name": "Carol", "profile": "", "picture": ""}
        )
        _, visitor, visit, said, *_ = loop.run(page.resume("", "0" * 32, request, profile))
        assert visitor == account_id("huggingface", "carol") and visit.account == "carol"
        assert said.startswith("Signed in as `carol`")
        _, anonymous, visit, said, *_ = loop.run(page.resume("", "0" * 32, request, None))
        assert anonymous != visitor and visit.account is None and said.startswith("Not signed in")
    finally:
        decoder.close()
