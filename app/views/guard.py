"""The page's public surface, enforced in front of Gradio (an ASGI middleware).

Gradio serves more than the page needs, and says more than users should see. In front of it:
- Only `/chat` is callable by name (`/gradio_api/call/<name>`): the page's own events run
  through the queue with the page's session, and are not an API. The REST route that skips the
  queue (`/gradio_api/run/...`, and the same route's older name `/gradio_api/api/...`) is closed
  here, in one line (Gradio logged a traceback for a bad call to it), but for the page's own
  queue-less events (an example's click) through `/run/predict`, each checked.
- Uploads, and every other API request, are taken from this page's origin (its public URL when
  one is set, as behind a proxy that rewrites `Host`; else the host it is asked at), or from
  clients that send no `Origin`, such as `gradio_client`; never from another site's page
  (Gradio's CORS answers any site on a public host, credentials allowed, and on a Space the
  visitor's cookie goes cross-site, so that the Space's frame on huggingface.co keeps it).
- The `Host` header is checked against the addresses the page is served at, and forwarded-host
  headers are dropped, so the page's `/config` never tells a visitor an address it made up.
- Server paths never leave the server: Gradio's upload folder is `@uploads/` on the wire and
  the examples' folder `@examples/` (in answers, file URLs and upload results). In requests,
  only the fields that carry a file reference (a `path` or `url` of Gradio's file data) are
  turned back into the folder: text a visitor writes is never rewritten.
- A JSON request's body is at most `MAX_JSON_BODY` bytes (a message's text and its file
  references; files themselves go to `/upload`, bounded by APP_MAX_UPLOAD).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API = "/gradio_api"
WIRE_NAME = b"@uploads/"
EXAMPLES_WIRE_NAME = b"@examples/"
MAX_JSON_BODY = 4 * 2**20
FILE_FIELDS = ("path", "url")
DROPPED_HEADERS = {b"x-forwarded-host", b"x-forwarded-proto", b"x-forwarded-port", b"forwarded"}
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        upload_folder: str,
        allowed_hosts: set[str] | None,
        public_api: Collection[str],
        examples_folder: str | None = None,
        public_url: str | None = None,
        page_calls: Mapping[int, Callable[[list[Any]], bool]] | None = None,
    ) -> None:
        """`allowed_hosts`: host names the page answers to (None: any, when it listens on every
        interface and its public address is not known). `public_url`: where visitors reach the
        page, whose origin uploads may come from. `page_calls`: the page's queue-less events by
        index, each with a check of the inputs a call hands it (`/run/predict`)."""
        self.app = app
        self.folder = upload_folder.rstrip("/").encode() + b"/"
        # Wire name -> folder, for every folder whose files the page shows.
        self.folders = {WIRE_NAME: self.folder}
        if examples_folder:
            self.folders[EXAMPLES_WIRE_NAME] = examples_folder.rstrip("/").encode() + b"/"
        self.allowed_hosts = allowed_hosts
        self.public_api = public_api
        self.public_origin = origin_of(public_url) if public_url else None
        self.page_calls = page_calls or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = [(name, value) for name, value in scope["headers"] if name not in DROPPED_HEADERS]
        scope["headers"] = headers
        values = dict(headers)
        host = values.get(b"host", b"").decode("latin-1")
        if self.allowed_hosts is not None and urlsplit(f"//{host}").hostname not in self.allowed_hosts:
            await refuse(send, 421, "This page is not served at that address.")
            return
        path: str = scope["path"]
        if path.startswith(f"{API}/call/") and path.split("/")[3] not in self.public_api:
            endpoints = " and ".join(f"/{name}" for name in self.public_api)
            await refuse(send, 404, f"Not found: the API's endpoints are {endpoints}.")
            return
        # Gradio serves the route that skips the queue under two names, `/run/` and `/api/`
        # ("for backwards compatibility"); the page uses the first only.
        if path.startswith((f"{API}/run/", f"{API}/api/")):
            try:
                receive = await self._page_call(path, receive)
            except (NotAPageCall, BodyTooLarge):
                endpoints = " and ".join(f"/{name}" for name in self.public_api)
                await refuse(
                    send, 404, f"Not found: call the API's endpoints ({endpoints}) through /call or a client."
                )
                return
        if path.startswith(f"{API}/upload") and not self.same_origin(values.get(b"origin"), host):
            await refuse(send, 403, "Uploads are taken from this page only.")
            return
        if path.startswith(f"{API}/") and not self.same_origin(values.get(b"origin"), host):
            # Gradio's CORS lets any site's page call a public host with the visitor's cookie.
            await refuse(
                send, 403, "The API takes requests from this page or from a script, not from another site."
            )
            return
        if path.startswith(API) and scope["type"] == "http":
            self._to_server(scope)
            try:
                receive = await self._body_to_server(scope, receive)
            except BodyTooLarge:
                await refuse(send, 413, f"A request's body takes at most {MAX_JSON_BODY // 2**20} MiB.")
                return
        if scope["type"] == "http":
            # The page and its /config name the examples' files too, outside the API's routes.
            send = self._to_wire(scope, send)
        await self.app(scope, receive, send)

    async def _page_call(self, path: str, receive: Receive) -> Receive:
        """The page runs its queue-less events (an example's click, an idle input) through
        `/run/predict` by index. Only those, with as many inputs as they take and each input
        one the page could send, pass: anything else is refused before Gradio (which printed a
        traceback for an unknown index or a missing input)."""
        if path.rstrip("/") != f"{API}/run/predict":
            raise NotAPageCall
        body, instead = await read_body(receive)
        if instead is not None:
            raise NotAPageCall
        try:
            call = json.loads(body)
        except ValueError:
            raise NotAPageCall from None
        if not isinstance(call, dict) or not isinstance(call.get("data"), list):
            raise NotAPageCall
        accepts = self.page_calls.get(call.get("fn_index")) if type(call.get("fn_index")) is int else None
        if accepts is None or not accepts(call["data"]):
            raise NotAPageCall
        return _replay({"type": "http.request", "body": body, "more_body": False}, receive)

    def same_origin(self, origin: bytes | None, host: str) -> bool:
        """No `Origin` (a script, not a browser page), or this page's own: its public URL's
        where one is set, else the host it was asked at."""
        if not origin or origin == b"null":
            return origin is None
        asked = origin_of(origin.decode("latin-1"))
        if self.public_origin is not None:
            return asked == self.public_origin
        return urlsplit(origin.decode("latin-1")).netloc == host

    def _to_server(self, scope: Scope) -> None:
        for wire_name, folder in self.folders.items():
            wire = wire_name.decode()
            if wire in scope["path"]:
                scope["path"] = scope["path"].replace(wire, folder.decode())
                scope["raw_path"] = scope["path"].encode()
            if wire_name in scope.get("query_string", b""):
                scope["query_string"] = scope["query_string"].replace(wire_name, folder)

    async def _body_to_server(self, scope: Scope, receive: Receive) -> Receive:
        """A JSON request's body (at most `MAX_JSON_BODY`) with the wire names in its file
        references turned back into their folders; everything else as it was sent."""
        headers = dict(scope["headers"])
        if scope["type"] != "http" or b"json" not in headers.get(b"content-type", b""):
            return receive
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > MAX_JSON_BODY:
            raise BodyTooLarge
        body, instead = await read_body(receive)
        if instead is not None:
            return _replay(instead, receive)
        if any(wire_name in body for wire_name in self.folders):
            body = self._file_references_to_server(body)
        scope["headers"] = [(n, v) for n, v in scope["headers"] if n != b"content-length"] + [
            (b"content-length", str(len(body)).encode())
        ]
        return _replay({"type": "http.request", "body": body, "more_body": False}, receive)

    def _file_references_to_server(self, body: bytes) -> bytes:
        try:
            document = json.loads(body)
        except ValueError:
            return body  # not JSON after all: Gradio answers it as it does
        return json.dumps(self._walk(document)).encode()

    def _walk(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._walk(item) for item in value]
        if not isinstance(value, dict):
            return value
        walked = {key: self._walk(item) for key, item in value.items()}
        for key in FILE_FIELDS:
            if isinstance(walked.get(key), str):
                walked[key] = self._from_wire(walked[key])
        return walked

    def _from_wire(self, reference: str) -> str:
        """A file reference with a wire name, at its start or after `file=` (a URL), turned back."""
        for wire_name, folder in self.folders.items():
            wire = wire_name.decode()
            if reference.startswith(wire):
                return folder.decode() + reference[len(wire) :]
            if f"file={wire}" in reference:
                return reference.replace(f"file={wire}", f"file={folder.decode()}", 1)
        return reference

    def _to_wire(self, scope: Scope, send: Send) -> Send:
        """Answers with the folder written as the wire name. A file's own bytes are served as
        they are (never scanned or changed); a refused file's answer names no path."""
        folders = self.folders
        is_file = scope["path"].startswith(f"{API}/file=")
        state: dict[str, Any] = {}

        async def send_to_wire(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                if is_file and status in (403, 404):
                    state["refused"] = True
                    body = b"This file is not available."
                    headers = [(b"content-type", b"text/plain; charset=utf-8")]
                    await send({"type": "http.response.start", "status": status, "headers": headers})
                    await send({"type": "http.response.body", "body": body})
                    return
                if not is_file:  # the body's length changes where the folder is renamed
                    headers = [(n, v) for n, v in message.get("headers", []) if n != b"content-length"]
                    message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                if state.get("refused"):
                    return
                if not is_file:
                    body = message.get("body", b"")
                    for wire_name, folder in folders.items():
                        body = body.replace(folder, wire_name)
                    message = {**message, "body": body}
            await send(message)

        return send_to_wire


async def read_body(receive: Receive) -> tuple[bytes, Message | None]:
    """A request's whole body (at most `MAX_JSON_BODY`, else `BodyTooLarge`), and the message
    that came instead of the rest of it (the client's disconnect), if one did."""
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return body, message
        body += message.get("body", b"")
        if len(body) > MAX_JSON_BODY:
            raise BodyTooLarge
        if not message.get("more_body", False):
            return body, None


def _replay(first: Message, then: Receive) -> Receive:
    """`first`, then what the client sends next (its disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return first
        return await then()

    return receive


class NotAPageCall(Exception):
    """A call to `/run/predict` that is not one of the page's own queue-less events."""


class BodyTooLarge(Exception):
    """A request's body past `MAX_JSON_BODY`."""


def origin_of(url: str) -> str:
    """A URL's origin: scheme, host and port (the default port written out)."""
    parts = urlsplit(url.strip())
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme, 0)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


async def refuse(send: Send, status: int, line: str, retry_after_s: int | None = None) -> None:
    body = json.dumps({"error": line}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def allowed_hosts(bind_host: str, public_url: str | None) -> set[str] | None:
    """The host names the page answers to: its public address and the loopback names, plus
    the address it listens on; any when it listens on every interface with no public address."""
    hosts = set(LOOPBACK)
    if public_url:
        hosts.add(urlsplit(public_url).hostname or "")
    elif bind_host in ("0.0.0.0", "::", ""):  # noqa: S104 (a check, not a binding)
        return None
    hosts.add(bind_host)
    return hosts
