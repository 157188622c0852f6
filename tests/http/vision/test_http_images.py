"""Image parts through the server, for the three APIs, on the fake engine with a fake vision front
(tests/support/http_doubles/fake_vision.py): images reach `engine.vision.expand` decoded, in
order across messages, off the event loop; the expanded ids and the payload reach the engine, and
the usage counts the image tokens. Every bad image is a 400 naming its part (the error's `code`
its kind), nothing reaches the engine, and the server keeps serving; a text model refuses images.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine
from http_doubles.fake_vision import IMAGE_TOKEN, FakeVision, PartsTokenizer, image_tokens
from http_doubles.images import b64, data_url, image_bytes, noise_png
from http_helpers import Resp, post, request, serving
from rillet.core.config import load_config
from rillet.core.vision.image import decode_image
from rillet.http.background import BackgroundServer

MODEL = "fake-model"
# Small limits, so the tests' images cross them: 64 x 64 pixels, 8 KiB, 3 images.
LIMITS = ["vision.max_images=3", "vision.max_pixels=4096", "vision.max_image_bytes=8192"]
LISTED = 'vision.allowed_domains=["127.0.0.1", "localhost", "images.example"]'
PNG, JPEG, GIF = image_bytes(8, 8), image_bytes(16, 8, "JPEG"), image_bytes(24, 16, "GIF", (0, 90, 200))


@dataclass(frozen=True)
class Img:
    url: str  # a data: URL (Messages sends it as a base64 source), http(s), file:// or a path


Turn = tuple[str, list[str | Img]]


@dataclass(frozen=True)
class Api:
    name: str
    path: str

    def body(self, turns: list[Turn], **extra: Any) -> dict[str, Any]:
        if self.name == "chat":
            msgs = [{"role": r, "content": [self._chat(x) for x in items]} for r, items in turns]
            return {"model": MODEL, "max_tokens": 3, "messages": msgs, **extra}
        if self.name == "messages":
            msgs = [{"role": r, "content": [self._block(x) for x in items]} for r, items in turns]
            return {"model": MODEL, "max_tokens": 3, "messages": msgs, **extra}
        items_ = [{"role": r, "content": [self._input(x, r) for x in items]} for r, items in turns]
        return {"model": MODEL, "max_output_tokens": 3, "input": items_, **extra}

    def part(self, i: int, j: int) -> str:
        return {"chat": "messages[{}].content[{}]", "messages": "messages.{}.content.{}"}.get(
            self.name, "input[{}].content[{}]"
        ).format(i, j)

    def prompt_tokens(self, resp: Resp) -> int:
        usage = resp.json()["usage"]
        return int(usage["prompt_tokens"] if self.name == "chat" else usage["input_tokens"])

    @staticmethod
    def _chat(x: str | Img) -> dict[str, Any]:
        if isinstance(x, Img):
            return {"type": "image_url", "image_url": {"url": x.url, "detail": "auto"}}
        return {"type": "text", "text": x}

    @staticmethod
    def _block(x: str | Img) -> dict[str, Any]:
        if not isinstance(x, Img):
            return {"type": "text", "text": x}
        if x.url.startswith("data:"):
            media_type, data = x.url[5:].split(";base64,", 1)
            return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
        return {"type": "image", "source": {"type": "url", "url": x.url}}

    @staticmethod
    def _input(x: str | Img, role: str) -> dict[str, Any]:
        if isinstance(x, Img):
            return {"type": "input_image", "image_url": x.url, "detail": "auto"}
        return {"type": "output_text" if role == "assistant" else "input_text", "text": x}


APIS = [
    Api("chat", "/v1/chat/completions"),
    Api("messages", "/v1/messages"),
    Api("responses", "/v1/responses"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vision")
    (root / "images").mkdir()
    (root / "images" / "ok.png").write_bytes(PNG)
    (root / "secret.png").write_bytes(PNG)
    return root


def vision_engine(*overrides: str) -> FakeEngine:
    cfg = load_config(None, list(overrides))
    engine = FakeEngine(cfg)
    engine.tokenizer = PartsTokenizer()
    engine.vision = FakeVision(cfg.vision.max_images, cfg.vision.max_pixels)
    return engine


@pytest.fixture(scope="module")
def vlm(folder: Path) -> Iterator[tuple[FakeEngine, BackgroundServer]]:
    overrides = [*LIMITS, LISTED, f"vision.allowed_local_path={folder / 'images'}"]
    engine = vision_engine(*overrides)
    engine.start()
    with serving(engine, *overrides) as srv:
        yield engine, srv
    engine.shutdown()


def hashes(*images: bytes) -> list[bytes]:
    return [decode_image(b, "p", 10**6).content_hash for b in images]


def refused(api: Api, resp: Resp, part: str, code: str) -> None:
    """A 400 naming the part, in the API's error shape (Anthropic's carries it in the message)."""
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["message"].startswith(f"{part}: "), err
    if api.name != "messages":
        assert (err["param"], err["code"]) == (part, code), err


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_images_in_order_across_messages(vlm: tuple[FakeEngine, BackgroundServer], api: Api) -> None:
    engine, srv = vlm
    vision = engine.vision
    assert isinstance(vision, FakeVision)
    turns: list[Turn] = [
        ("user", ["Compare", Img(data_url(PNG)), Img(data_url(JPEG, "image/jpeg"))]),
        ("assistant", ["They differ."]),
        ("user", [Img(data_url(GIF, "image/gif")), "and this one?"]),
    ]
    resp = post(srv, api.path, api.body(turns))
    assert resp.status_code == 200, resp.text
    want = hashes(PNG, JPEG, GIF)
    assert [i.content_hash for i in vision.calls[-1]] == want
    assert [i.part for i in vision.calls[-1]] == [api.part(0, 1), api.part(0, 2), api.part(2, 0)]
    assert vision.on_loop[-1] is False  # expand ran on a worker thread
    sent = engine.added[-1]
    assert sent.mm == tuple(want)
    assert sent.prompt_ids.count(IMAGE_TOKEN) == sum(image_tokens(i) for i in vision.calls[-1]) == 1 + 2 + 6
    assert api.prompt_tokens(resp) == len(sent.prompt_ids)  # the image tokens counted


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_text_only_prompts_go_in_without_a_payload(
    vlm: tuple[FakeEngine, BackgroundServer], api: Api
) -> None:
    engine, srv = vlm
    resp = post(srv, api.path, api.body([("user", ["Hello"])]))
    assert resp.status_code == 200, resp.text
    assert engine.added[-1].mm is None and IMAGE_TOKEN not in engine.added[-1].prompt_ids


def bad_cases(folder: Path) -> list[tuple[str, list[str | Img], int, str]]:
    """(name, the first user turn's parts, the refused part's index, the error code)."""
    truncated = noise_png(32, 32)
    half = truncated[: len(truncated) // 2]
    return [
        ("not base64", ["x", Img("data:image/png;base64,@@not-base64@@")], 1, "not_base64"),
        ("not an image", ["x", Img(data_url(b"hello, world"))], 1, "not_an_image"),
        ("truncated", ["x", Img(data_url(half))], 1, "truncated"),
        ("too many pixels", ["x", Img(data_url(image_bytes(65, 64)))], 1, "too_many_pixels"),
        ("too many bytes", ["x", Img(data_url(noise_png(64, 64)))], 1, "too_large"),
        ("too many images", [Img(data_url(PNG))] * 4, 3, "too_many_images"),
        ("domain not listed", ["x", Img("https://example.com/cat.png")], 1, "forbidden"),
        ("listed but loopback", ["x", Img("http://127.0.0.1:9/cat.png")], 1, "forbidden"),
        ("listed but resolves to loopback", ["x", Img("http://localhost:9/cat.png")], 1, "forbidden"),
        ("file outside the folder", ["x", Img(f"file://{folder}/secret.png")], 1, "forbidden"),
        ("a .. escape", ["x", Img(f"{folder}/images/../secret.png")], 1, "forbidden"),
        ("not a URL", ["x", Img("cat.png")], 1, "forbidden"),
    ]


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_bad_images_are_400s_naming_the_part(
    vlm: tuple[FakeEngine, BackgroundServer], folder: Path, api: Api
) -> None:
    engine, srv = vlm
    for name, parts, j, code in bad_cases(folder):
        before = len(engine.added)
        turns: list[Turn] = [("user", ["first"]), ("assistant", ["ok"]), ("user", parts)]
        refused(api, post(srv, api.path, api.body(turns)), api.part(2, j), code)
        assert len(engine.added) == before, name  # nothing reached the engine
    ok = post(srv, api.path, api.body([("user", ["still", Img(f"file://{folder}/images/ok.png")])]))
    assert ok.status_code == 200, ok.text  # and the server still serves, local files included


def test_urls_are_refused_by_default(make_fake: Callable[..., FakeEngine]) -> None:
    engine = vision_engine()
    engine.start()
    try:
        with serving(engine) as srv:
            for api in APIS:
                for url in ("http://127.0.0.1/cat.png", "https://example.com/cat.png", "file:///etc/hosts"):
                    resp = post(srv, api.path, api.body([("user", [Img(url)])]))
                    refused(api, resp, api.part(0, 0), "forbidden")
    finally:
        engine.shutdown()


def test_a_text_model_refuses_images(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake()
    with serving(engine) as srv:
        for api in APIS:
            body = api.body([("user", ["look", Img("https://example.com/cat.png")])])
            refused(api, post(srv, api.path, body), api.part(0, 1), "not_supported")
            assert "does not take images" in post(srv, api.path, body).text
        chat, messages, _ = APIS
        turns: list[Turn] = [("user", ["look", Img(data_url(PNG))])]
        counted = post(
            srv, "/v1/messages/count_tokens", {"model": MODEL, "messages": messages.body(turns)["messages"]}
        )
        refused(messages, counted, "messages.0.content.1", "not_supported")
        refused(
            chat,
            post(srv, "/tokenize", {"messages": chat.body(turns)["messages"]}),
            chat.part(0, 1),
            "not_supported",
        )
        # an image where no turn takes one: refused as before, naming its type
        chat = APIS[0].body([("user", ["hi"]), ("assistant", [Img(data_url(PNG))]), ("user", ["?"])])
        resp = post(srv, APIS[0].path, chat)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages[1].content[0].type"
        assert post(srv, APIS[0].path, APIS[0].body([("user", ["hi"])])).status_code == 200


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_a_placeholder_typed_as_text_is_refused(vlm: tuple[FakeEngine, BackgroundServer], api: Api) -> None:
    """The template's image placeholder written by the user, with no image for it: expand refuses
    it (a real front must too), so it never reaches the engine as an image token."""
    engine, srv = vlm
    before = len(engine.added)
    resp = post(srv, api.path, api.body([("user", ["sneaky \x01 placeholder"])]))
    assert resp.status_code == 400, resp.text
    field = "input" if api.name == "responses" else "messages"
    assert resp.json()["error"]["message"].startswith(f"{field}: "), resp.text
    assert len(engine.added) == before


def test_shapes_name_their_field(vlm: tuple[FakeEngine, BackgroundServer]) -> None:
    _, srv = vlm
    chat, messages, responses = APIS
    user = [{"type": "text", "text": "x"}]

    def chat_with(part: dict[str, Any]) -> dict[str, Any]:
        return {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": [*user, part]}]}

    for part, param in [
        ({"type": "image_url"}, "messages[0].content[1].image_url"),
        ({"type": "image_url", "image_url": {"detail": "auto"}}, "messages[0].content[1].image_url.url"),
        (
            {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "max"}},
            "messages[0].content[1].image_url.detail",
        ),
    ]:
        resp = post(srv, chat.path, chat_with(part))
        assert (resp.status_code, resp.json()["error"]["param"]) == (400, param), resp.text
    bare = post(srv, chat.path, chat_with({"type": "image_url", "image_url": data_url(PNG)}))  # some clients
    assert bare.status_code == 200, bare.text

    def response_with(part: dict[str, Any]) -> dict[str, Any]:
        return {"model": MODEL, "max_output_tokens": 3, "input": [{"role": "user", "content": [part]}]}

    for part, param in [
        ({"type": "input_image", "file_id": "file-1"}, "input[0].content[0].file_id"),
        ({"type": "input_image", "image_url": data_url(PNG), "detail": "max"}, "input[0].content[0].detail"),
        ({"type": "input_image"}, "input[0].content[0].image_url"),
    ]:
        resp = post(srv, responses.path, response_with(part))
        assert (resp.status_code, resp.json()["error"]["param"]) == (400, param), resp.text

    for source, field in [
        ({"type": "file", "file_id": "f"}, "messages.0.content.0.source.type"),
        (
            {"type": "base64", "media_type": "text/plain", "data": b64(PNG)},
            "messages.0.content.0.source.media_type",
        ),
        ({"type": "url"}, "messages.0.content.0.source.url"),
        ({"type": "bytes"}, "messages.0.content.0.source.type"),
    ]:
        content = [{"type": "image", "source": source}]
        body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": content}]}
        resp = post(srv, messages.path, body)
        assert resp.status_code == 400 and field in resp.json()["error"]["message"], resp.text


def test_token_counts_include_images(vlm: tuple[FakeEngine, BackgroundServer]) -> None:
    _, srv = vlm
    chat, messages, _ = APIS
    turns: list[Turn] = [("user", ["what?", Img(data_url(GIF, "image/gif"))])]
    used = chat.prompt_tokens(post(srv, chat.path, chat.body(turns)))
    counted = post(srv, "/tokenize", {"messages": chat.body(turns)["messages"]}).json()
    assert counted["count"] == used and counted["tokens"].count(IMAGE_TOKEN) == 6
    body = messages.body(turns)
    n = post(srv, "/v1/messages/count_tokens", {"model": MODEL, "messages": body["messages"]}).json()
    assert n["input_tokens"] == messages.prompt_tokens(post(srv, messages.path, body))


def test_a_continued_response_keeps_its_images(vlm: tuple[FakeEngine, BackgroundServer]) -> None:
    engine, srv = vlm
    vision = engine.vision
    assert isinstance(vision, FakeVision)
    api = APIS[2]
    first = post(srv, api.path, api.body([("user", ["see", Img(data_url(JPEG, "image/jpeg"))])]))
    assert first.status_code == 200, first.text
    previous = first.json()["id"]
    body = {"model": MODEL, "max_output_tokens": 3, "input": "and now?", "previous_response_id": previous}
    again = post(srv, api.path, body)
    assert again.status_code == 200, again.text
    assert [i.content_hash for i in vision.calls[-1]] == hashes(JPEG)
    assert engine.added[-1].mm == tuple(hashes(JPEG))
    listed = request(srv, "GET", f"/v1/responses/{first.json()['id']}/input_items").json()["data"]
    assert listed[0]["content"][1]["type"] == "input_image"  # the stored input, as given
