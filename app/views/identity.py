"""Who a visitor is, as the server says, never as the browser says.

A visitor's id is issued by the server in a signed, HttpOnly cookie (`vlm_visitor`): a page's
script cannot read or forge it, and a script that drops it is a new visitor with no history and
no votes behind it. The signing key lives in the data folder (so ids outlive a restart) or, where
that cannot be written, in the process. The client's address is the connection's peer, or,
behind a reverse proxy listed in APP_TRUSTED_PROXIES (addresses or ranges), the last address in
X-Forwarded-For that is not one of those proxies: a visitor cannot pick it either. An IPv6
client counts by its /64 network (`client_key`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
from collections.abc import Awaitable, Callable, Collection, Iterable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

COOKIE = "vlm_visitor"
MAX_AGE_S = 365 * 86400
ID_LENGTH = 32  # hex characters, as the history's browser ids

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]


def signing_key(folder: Path | None) -> bytes:
    """The key ids are signed with: kept in `folder` (made once, readable by the app only), else
    a new one for this process (ids then last as long as it does)."""
    if folder is not None:
        path = Path(folder) / "visitor-key"
        try:
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_name(f"{path.name}.{secrets.token_hex(4)}")
                partial.write_bytes(secrets.token_bytes(32))
                partial.chmod(0o600)
                partial.replace(path)
            key = path.read_bytes()
            if len(key) >= 32:
                return key
        except OSError:
            log.warning("the visitor key cannot be kept in %s: ids last until a restart", folder)
    return secrets.token_bytes(32)


class TrustedProxies:
    """The reverse proxies whose forwarding headers are believed: addresses or ranges (a hosted
    proxy answers from a pool of addresses)."""

    def __init__(self, entries: Collection[str] = ()) -> None:
        self.networks = [ipaddress.ip_network(entry, strict=False) for entry in entries]

    def __contains__(self, address: object) -> bool:
        try:
            parsed = ipaddress.ip_address(str(address))
        except ValueError:
            return False
        return any(parsed in network for network in self.networks)

    def __bool__(self) -> bool:
        return bool(self.networks)


def forwarded_for(lines: Iterable[str]) -> str | None:
    """A request's X-Forwarded-For lines as one list, in order: a proxy may add its entry as a
    line of its own, and reading the first or the last line alone believed the client's."""
    joined = ", ".join(line for line in lines if line.strip())
    return joined or None


def bare(address: str) -> str:
    """An address as some proxies write it, with a port (`198.51.100.1:5678`, `[2001:db8::1]:443`),
    without it."""
    text = address.strip()
    if text.startswith("[") and "]" in text:
        return text[1 : text.index("]")]
    if text.count(":") == 1:
        return text.partition(":")[0]
    return text


def client_key(address: str) -> str:
    """What counts as one client (answers running, votes, requests): an IPv4 address, or an IPv6
    address's /64 network, which one client usually has whole (counted by single address, it
    had billions of allowances). Anything not an address stays as it is."""
    written = bare(address)
    if not written:
        return "unknown"
    try:
        parsed = ipaddress.ip_address(written)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


# Where the door (`app.views.doorway`) keeps the client key it worked out for a request, in the
# request's ASGI scope: the handlers that count the client read it there, not the headers again.
CLIENT_KEY = "vlm.client"


def kept_client(request: Any) -> str | None:
    """The client key the door kept in a server request's scope (`CLIENT_KEY`), if it saw it."""
    key = getattr(request, "scope", {}).get(CLIENT_KEY)
    return key if isinstance(key, str) else None


# Proxies in front of the app believed at most: the client is the last hop not one of them.
MAX_HOPS = 16

# The addresses only a host's own network uses (a Space's proxy comes from one of these).
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
# Where a reverse proxy in front of the app most likely stands: the host itself or its network.
HOST_NETWORK = TrustedProxies((*PRIVATE_RANGES, "127.0.0.0/8", "::1/128"))


class Identity:
    def __init__(
        self, key: bytes, trusted_proxies: Collection[str] = (), secure: bool = False, framed: bool = False
    ) -> None:
        """`secure`: served over https. `framed`: shown inside another site's page (a Space's
        frame on huggingface.co), where the cookie must go cross-site."""
        self.key = key
        self.trusted_proxies = TrustedProxies(trusted_proxies)
        self.secure = secure
        self.framed = framed and secure
        self.untrusted_proxy_named = False

    def sign(self, visitor: str) -> str:
        return f"{visitor}.{self._mac(visitor)}"

    def verify(self, value: str | None) -> str | None:
        """The id a cookie's value carries, if this server signed it."""
        visitor, _, mac = (value or "").partition(".")
        valid = len(visitor) == ID_LENGTH and all(c in "0123456789abcdef" for c in visitor)
        return visitor if valid and hmac.compare_digest(mac, self._mac(visitor)) else None

    def _mac(self, visitor: str) -> str:
        return hmac.new(self.key, visitor.encode(), hashlib.sha256).hexdigest()[:32]

    def visitor(self, headers: Any) -> str | None:
        """The visitor's id from a request's cookie header, if it carries a valid one."""
        raw = headers.get("cookie") if headers is not None else None
        if not raw:
            return None
        try:
            morsel = SimpleCookie(raw).get(COOKIE)
        except CookieError:
            return None
        return self.verify(morsel.value) if morsel is not None else None

    def address(self, peer: str | None, forwarded_for: str | None) -> str:
        """The client's address (`client_key`): the peer's, or behind a trusted proxy the one it
        forwarded for (`forwarded_for` joins the header's lines)."""
        address = peer or "unknown"
        if forwarded_for and address not in self.trusted_proxies:
            self._name_untrusted_proxy(address)
        elif forwarded_for:
            # The last hops only: a long header (a client's own entries first) costs no more.
            hops = forwarded_for.rsplit(",", MAX_HOPS)[-MAX_HOPS:]
            for hop in reversed([bare(part) for part in hops if part.strip()]):
                address = hop
                if hop not in self.trusted_proxies:
                    break
        return client_key(address)

    def _name_untrusted_proxy(self, peer: str) -> None:
        """Once: a peer on the host's own network (a reverse proxy in front of the app, most
        likely) forwards for clients, but is not trusted, so every visitor counts as it. A peer
        from the public internet that sends the header is a client writing its own: not named."""
        if self.untrusted_proxy_named:
            return
        if bare(peer) in HOST_NETWORK:
            self.untrusted_proxy_named = True
            log.warning(
                "requests from %s carry X-Forwarded-For, but it is not in APP_TRUSTED_PROXIES: if it "
                "is your reverse proxy, every visitor behind it counts as one client (one allowance "
                "of answers, votes and requests); list it in APP_TRUSTED_PROXIES (not if it is a "
                "client on your network that wrote the header itself)",
                peer,
            )

    def client_of(self, request: Any) -> str:
        """The client address (`address`) of a Gradio request: the one the door kept in its scope
        (`kept_client`), or worked out from its peer and headers where no door stood before it."""
        # The server's own request, not Gradio's copy (which would turn the scope into JSON).
        kept = kept_client(getattr(request, "request", None))
        if kept is not None:
            return kept
        if request is None:
            return self.address(None, None)
        return self.address(
            getattr(request.client, "host", None), forwarded_for(request.headers.getlist("x-forwarded-for"))
        )

    def address_key(self, address: str) -> str:
        """What the database keeps of an address: a keyed hash, never the address itself."""
        return hmac.new(self.key, f"address:{address}".encode(), hashlib.sha256).hexdigest()[:32]

    def cookie_header(self, visitor: str) -> bytes:
        """`SameSite=None` only where the page is framed by another site (a Space: huggingface.co
        frames the app at hf.space, where a browser keeps no `Lax` cookie); there the page may be
        framed by huggingface.co and itself only (`frame_ancestors`), so no other site can show it
        with the visitor's cookie. Elsewhere `Lax`, `Secure` over https."""
        same_site = "None" if self.framed else "Lax"
        attributes = f"Max-Age={MAX_AGE_S}; Path=/; HttpOnly; SameSite={same_site}"
        attributes += "; Secure" if self.secure else ""
        return f"{COOKIE}={self.sign(visitor)}; {attributes}".encode("latin-1")

    @property
    def frame_ancestors(self) -> bytes | None:
        """The Content-Security-Policy a framed page's responses carry (None: not framed)."""
        return b"frame-ancestors 'self' https://huggingface.co" if self.framed else None


class IdentityMiddleware:
    """Gives every HTTP request that carries no valid id one: the response sets the cookie, and
    the request goes on with it, so the page's first load already has its visitor."""

    def __init__(self, app: ASGIApp, identity: Identity) -> None:
        self.app = app
        self.identity = identity

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        added = []
        if (policy := self.identity.frame_ancestors) is not None:
            added.append((b"content-security-policy", policy))
        if self.identity.visitor(headers) is None:
            visitor = secrets.token_hex(ID_LENGTH // 2)
            signed = f"{COOKIE}={self.identity.sign(visitor)}".encode("latin-1")
            # Any forged or stale cookie of ours is replaced, for this request and the browser.
            kept = [(n, v) for n, v in scope["headers"] if n != b"cookie"]
            others = b"; ".join(
                part.strip()
                for part in headers.get("cookie", "").encode("latin-1").split(b";")
                if part.strip() and not part.strip().startswith(f"{COOKIE}=".encode())
            )
            scope["headers"] = [*kept, (b"cookie", b"; ".join(p for p in (others, signed) if p))]
            added.append((b"set-cookie", self.identity.cookie_header(visitor)))
        if not added:
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
