"""Signing in, where the operator turns it on (`APP_SIGN_IN`): who a visitor is when an account
says so, rather than an anonymous cookie (`app.views.identity`).

- `huggingface`: Gradio's "Sign in with Hugging Face" on a Space (`hf_oauth: true` in the Space's
  README); the account is the Hugging Face user name.
- `proxy`: a reverse proxy that signs people in (oauth2-proxy, Authelia, a company's SSO) names
  the user in a header (`APP_SIGN_IN_HEADER`, default `X-Forwarded-User`); the header is believed
  only on requests that come from one of `APP_TRUSTED_PROXIES`.
- `password`: Gradio's own login page, checked against `APP_USERS_FILE`, one `name:hash` line
  per account, the password kept as a salted scrypt hash (`python -m app add-user NAME`).

A signed-in visitor's id is derived from the account (`account_id`), so their history and votes
are the same on every browser and device; an anonymous id is random and issued by the server, so
no visitor can pick an id that is an account's.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from app.views.identity import TrustedProxies

log = logging.getLogger(__name__)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
# scrypt's cost: 16 MiB of memory and about 50 ms a check on one core, so a stolen file is slow
# to guess from and a login is still quick.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1


class AccountError(ValueError):
    """A users file or an account name that cannot be used; the message says what to change."""


@dataclass(frozen=True)
class Account:
    name: str
    provider: str  # "huggingface", "proxy" or "password"

    @property
    def visitor(self) -> str:
        return account_id(self.provider, self.name)


def account_id(provider: str, name: str) -> str:
    """The id a signed-in visitor's history and votes are kept under: the same for the account on
    any browser, and a hash, so that no account's name reaches the database as a key."""
    return hashlib.sha256(f"account:{provider}:{name}".encode()).hexdigest()[:32]


def valid_name(name: str) -> str | None:
    name = name.strip()
    return name if NAME.fullmatch(name) else None


# --- password accounts ---


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def password_matches(password: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        given = hashlib.scrypt(
            password.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p), dklen=len(digest) // 2
        )
    except ValueError:
        return False
    return hmac.compare_digest(given.hex(), digest)


def read_users(path: Path) -> dict[str, str]:
    """The accounts of a users file: name -> stored hash. A line that is not `name:scrypt$...`
    stops the app at start with the line's number (a plain password is never taken)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise AccountError(f"APP_USERS_FILE {path} cannot be read ({error.strerror})") from None
    users: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, stored = line.strip().partition(":")
        if valid_name(name) is None or not stored.startswith("scrypt$") or stored.count("$") != 5:
            raise AccountError(
                f"APP_USERS_FILE {path}, line {number}: write name:hash lines; "
                "python -m app add-user NAME writes one"
            )
        users[name] = stored
    if not users:
        raise AccountError(f"APP_USERS_FILE {path} holds no account: python -m app add-user NAME adds one")
    return users


def add_user(path: Path, name: str, password: str) -> None:
    """Adds `name` to the users file, or changes its password; the file is readable by its owner only."""
    if valid_name(name) != name:
        raise AccountError(
            "a name is letters, digits and . _ @ + -, up to 128, starting with a letter or digit"
        )
    if len(password) < 8:
        raise AccountError("a password has at least 8 characters")
    path = Path(path)
    users = read_users(path) if path.is_file() and path.stat().st_size else {}
    users[name] = hash_password(password)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    partial.write_text("".join(f"{user}:{stored}\n" for user, stored in users.items()), encoding="utf-8")
    os.chmod(partial, 0o600)
    partial.replace(path)


class PasswordCheck:
    """Gradio's `auth=` callable: the users file read once at start, each login checked in
    constant time whether or not the name exists (so timing does not tell names apart)."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = dict(users)
        self._decoy = hash_password(secrets.token_hex(8))

    def __call__(self, name: str, password: str) -> bool:
        stored = self.users.get(name)
        matches = password_matches(password, stored or self._decoy)
        if not (matches and stored):
            log.info("a sign-in was refused")
        return matches and stored is not None


# --- who is signed in on a request ---


class SignIn:
    """Reads the account a request carries, as the operator's mode says (`APP_SIGN_IN`)."""

    def __init__(
        self, mode: str, header: str = "X-Forwarded-User", trusted_proxies: Collection[str] = ()
    ) -> None:
        self.mode = mode
        self.header = header.lower()
        self.trusted_proxies = TrustedProxies(trusted_proxies)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def account(
        self, peer: str | None, headers: Mapping[str, str], username: str | None, profile_name: str | None
    ) -> Account | None:
        """`username`: Gradio's signed-in user (password mode); `profile_name`: the Hugging Face
        profile's user name (huggingface mode); the header only from a trusted proxy."""
        if self.mode == "proxy":
            named = headers.get(self.header) if peer in self.trusted_proxies else None
        elif self.mode == "password":
            named = username
        elif self.mode == "huggingface":
            named = profile_name
        else:
            named = None
        name = valid_name(named) if named else None
        return Account(name, self.mode) if name is not None else None
