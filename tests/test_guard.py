"""The request guard (`app.views.guard`) in front of a real ASGI app that echoes what reaches it:
what a hostile request can and cannot make the app see. The whole page behind it is tested in
Chromium (`test_ui_chat.py`, `test_ui_views.py`)."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app.views.guard import MAX_JSON_BODY, Guard

UPLOADS, EXAMPLES = "/srv/cache/gradio", "/srv/app/static/examples"


RECEIVED: list[bytes] = []  # what the app behind the guard was handed


async def echo(request: Request) -> JSONResponse:
    body = await request.body()
    RECEIVED.append(body)
    return JSONResponse({"path": request.url.path, "body": body.decode()})


async def upload(_: Request) -> PlainTextResponse:
    return PlainTextResponse(f'["{UPLOADS}/abc/photo.png"]')


def client(public_url: str | None = None, host: str = "testserver", page_calls=None) -> TestClient:
    routes = [
        Route("/gradio_api/upload", upload, methods=["POST"]),
        Route("/{rest:path}", echo, methods=["GET", "POST"]),
    ]
    guard = Middleware(
        Guard,
        upload_folder=UPLOADS,
        examples_folder=EXAMPLES,
        allowed_hosts=None,
        public_api=("chat",),
        public_url=public_url,
        page_calls=page_calls,
    )
    return TestClient(Starlette(routes=routes, middleware=[guard]), base_url=f"http://{host}")


def test_only_file_references_are_turned_back_into_server_paths_never_what_a_visitor_wrote():
    sent = {
        "data": [
            {
                "text": "What is in @uploads/../../etc/passwd and @examples/x?",
                "files": [
                    {
                        "path": "@uploads/abc/photo.png",
                        "url": "http://h/gradio_api/file=@uploads/abc/photo.png",
                    },
                    {"path": "@examples/shapes.png", "meta": {"_type": "gradio.FileData"}},
                ],
            }
        ],
        "fn_index": 3,
    }
    echoed = client().post("/gradio_api/queue/join", json=sent).json()
    received = json.loads(RECEIVED[-1])["data"][0]
    assert received["text"] == sent["data"][0]["text"]  # the visitor's words, as written
    assert received["files"][0]["path"] == f"{UPLOADS}/abc/photo.png"
    assert received["files"][0]["url"].endswith(f"file={UPLOADS}/abc/photo.png")
    assert received["files"][1]["path"] == f"{EXAMPLES}/shapes.png"
    # And on the way out, no server folder is named.
    assert UPLOADS not in json.dumps(echoed) and EXAMPLES not in json.dumps(echoed)


def test_no_server_folder_leaves_in_an_answer():
    answer = client().post("/gradio_api/upload", files={"files": ("p.png", b"png", "image/png")})
    assert answer.text == '["@uploads/abc/photo.png"]'
    echoed = client().get(f"/gradio_api/info?x={EXAMPLES}/a.png")
    assert EXAMPLES not in echoed.text


def test_a_json_body_past_the_limit_is_one_line_413():
    big = {"data": ["x" * (MAX_JSON_BODY + 10)]}
    refused = client().post("/gradio_api/queue/join", json=big)
    assert refused.status_code == 413 and "\n" not in refused.json()["error"]


def test_uploads_come_from_the_public_address_behind_a_proxy_that_rewrites_host():
    behind = client(public_url="https://vlm.example.org", host="127.0.0.1:7860")
    files = {"files": ("p.png", b"png", "image/png")}
    assert (
        behind.post(
            "/gradio_api/upload", files=files, headers={"Origin": "https://vlm.example.org"}
        ).status_code
        == 200
    )
    for foreign in ("https://elsewhere.example", "http://vlm.example.org", "http://127.0.0.1:7860"):
        assert behind.post("/gradio_api/upload", files=files, headers={"Origin": foreign}).status_code == 403
    # A script (no Origin) may upload; without a public URL the host it asks at is the page's.
    assert behind.post("/gradio_api/upload", files=files).status_code == 200
    direct = client(host="127.0.0.1:7860")
    assert (
        direct.post(
            "/gradio_api/upload", files=files, headers={"Origin": "http://127.0.0.1:7860"}
        ).status_code
        == 200
    )


def test_another_sites_page_reaches_no_api_route_only_this_page_and_scripts_do():
    """Gradio answers any site's page on a public host, credentials allowed (its CORS reflects the
    Origin): a page elsewhere could run this page's events with the visitor's cookie (sent
    cross-site over https, `SameSite=None`, so that a Space's frame keeps it) and read their
    history. The guard takes API requests from this page's origin, or from scripts (no Origin)."""
    behind = client(public_url="https://vlm.example.org", host="127.0.0.1:7860")
    join = {"data": [], "fn_index": 0, "session_hash": "abc"}
    for path in (
        "/gradio_api/queue/join",
        "/gradio_api/queue/data?session_hash=abc",
        "/gradio_api/call/chat",
    ):
        for foreign in ("https://elsewhere.example", "null", "http://vlm.example.org"):
            refused = behind.post(path, json=join, headers={"Origin": foreign})
            assert refused.status_code == 403 and "\n" not in refused.text, (path, foreign)
        assert behind.post(path, json=join, headers={"Origin": "https://vlm.example.org"}).status_code == 200
        assert behind.post(path, json=join).status_code == 200
    assert (
        behind.get("/gradio_api/queue/data", headers={"Origin": "https://elsewhere.example"}).status_code
        == 403
    )
    # The page itself, and what is not the API (its HTML, its config), stay anyone's to fetch.
    assert behind.get("/", headers={"Origin": "https://elsewhere.example"}).status_code == 200


def test_the_route_that_skips_the_queue_is_closed_in_one_line():
    """Under both its names: Gradio serves `/run/<name>` at `/api/<name>` too ("for backwards
    compatibility"), where a hostile review found every queue-less event callable with any inputs,
    and a bad index logged a traceback."""
    for path in (
        "/gradio_api/run/predict",
        "/gradio_api/run/chat",
        "/gradio_api/api/predict",
        "/gradio_api/api/predict/",
        "/gradio_api/api/chat",
    ):
        refused = client().post(path, json={"data": [1, 2, 3]})
        assert refused.status_code == 404 and "Traceback" not in refused.text and "\n" not in refused.text


def test_only_the_pages_own_queue_less_events_pass_through_run_predict():
    """The page's example clicks run through /run/predict by index; a script's guess at another
    index, or inputs the page would never send, stop at the guard in one line."""
    guarded = client(page_calls={0: lambda data: data in ([0], [1]), 4: lambda data: data == []})
    for call in ({"fn_index": 0, "data": [1]}, {"fn_index": 4, "data": []}):
        passed = guarded.post("/gradio_api/run/predict", json=call)
        assert passed.status_code == 200 and json.loads(passed.json()["body"]) == call
    for call in (
        {"fn_index": 0, "data": [2]},
        {"fn_index": 0, "data": [0, 0]},
        {"fn_index": 1, "data": []},
        {"fn_index": "0", "data": [0]},
        {"fn_index": True, "data": []},
        {"fn_index": 4},
        [0],
    ):
        refused = guarded.post("/gradio_api/run/predict", json=call)
        assert refused.status_code == 404 and "\n" not in refused.text, call
    assert guarded.post("/gradio_api/run/predict", content=b"{not json").status_code == 404
    assert guarded.post("/gradio_api/run/chat", json={"fn_index": 0, "data": [0]}).status_code == 404
    # The page never calls the other name: not even its own calls pass there.
    for call in ({"fn_index": 0, "data": [1]}, {"fn_index": 4, "data": []}):
        assert guarded.post("/gradio_api/api/predict", json=call).status_code == 404, call
