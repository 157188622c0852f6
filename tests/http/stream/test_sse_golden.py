"""Bytes on the wire: the chunked SSE body of fixed requests, every event kind, equal to a golden copy.

tests/data/sse_golden.json was written by the streaming path before issue 25 reworked it (the
dispatcher's wake-up, the write order, the single-token fast path): the rework may change how the
bytes are made, never which bytes. Each scenario drives the real ring, dispatcher, request stream,
SSE writer (its direct path to a transport and its pump) and chunk formats with a fixed sequence
of routing passes (the steps pushed while the loop is busy make one pass); the transport is
always free, so each pass is written before the next arrives.
Regenerate (only for an intended change of the wire format): `python -m pytest ... --regen-golden`
is not offered on purpose; run this module's `_regenerate()` by hand and review the diff.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from fake_engine import FakeTokenizer
from repo import REPO
from rillet.core.config import StreamConfig
from rillet.core.errors import ErrorKind
from rillet.core.outputs import SeqDelta, StepOutput
from rillet.core.ring import SpscRing
from rillet.core.sequence import FinishReason, TokenLogprob
from rillet.http.anthropic.events import MessagesFormat
from rillet.http.openai.chunks import ChunkFormat, Usage
from rillet.http.openai.logprobs import TokenTexts
from rillet.http.responses.events import ResponsesFormat
from rillet.http.stream.dispatcher import Dispatcher
from rillet.http.stream.event_format import EventFormat
from rillet.http.stream.request_stream import RequestStream
from rillet.http.stream.sse import pump_sse
from rillet.http.stream.transport_write import TransportWrite

GOLDEN = REPO / "tests" / "data" / "sse_golden.json"
STOP, LENGTH, ERROR, ABORT = FinishReason.STOP, FinishReason.LENGTH, FinishReason.ERROR, FinishReason.ABORT


@dataclass
class Scenario:
    passes: list[list[list[SeqDelta]]]  # routing passes, each holding engine steps' deltas
    chat: bool = True
    n: int = 1
    usage: bool = False
    tools: bool = False
    echo: list[str] | None = None
    limit: int = 16  # stream.max_tokens_per_event
    cut_off: bool = False  # the server cuts the request off (slow reader) after the passes
    extra: dict[str, Any] = field(default_factory=dict)


def d(
    text: str,
    index: int = 0,
    finish: FinishReason | None = None,
    done: int = 1,
    ntok: int = 1,
    lps: list[TokenLogprob] | None = None,
    error: str | None = None,
    kind: ErrorKind | None = None,
) -> SeqDelta:
    return SeqDelta("r", index, list(range(65, 65 + ntok)), text, lps, finish, 3, 1, done, error, kind)


def lp(tok: int) -> list[TokenLogprob]:
    return [TokenLogprob(tok, -0.25, [(tok, -0.25), (ord("x"), -2.0)])]


TOOL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SCENARIOS: dict[str, Scenario] = {
    "chat_plain": Scenario([[[d("Hel")]], [[d("lo", done=2)]], [[d(" world", finish=STOP, done=3)]]]),
    "chat_coalesced": Scenario(
        [
            [[d("a")], [d("b", done=2)], [d("c", done=3)], [d("d", done=4)], [d("e", done=5)]],
            [[d("", 0, STOP, 6)]],
        ],
        limit=2,
    ),
    "chat_n2_usage": Scenario(
        [
            [[d("x", 0), d("y", 1)]],
            [[d("x2", 0, done=2), d("y2", 1, done=2)]],
            [[d("", 0, LENGTH, 3), d("!", 1, LENGTH, 3)]],
        ],
        n=2,
        usage=True,
    ),
    "chat_held_back": Scenario(
        [[[d("ok")]], [[d("", done=2)]], [[d(" then", done=3)]], [[d("", 0, STOP, 4)]]]
    ),
    "chat_logprobs": Scenario(
        [
            [[d("A", lps=lp(65))]],
            [[d("B", done=2, lps=lp(66))], [d("C", done=3, lps=lp(67))]],
            [[d("", 0, STOP, 4)]],
        ],
    ),
    "completion_logprobs_echo": Scenario(
        [[[d("A", lps=lp(65))]], [[d("B", 0, LENGTH, 2, lps=lp(66))]]], chat=False, echo=["say:"]
    ),
    "completion_usage": Scenario([[[d("one")]], [[d(" two", 0, STOP, 2)]]], chat=False, usage=True),
    "chat_model_error": Scenario(
        [[[d("par")]], [[d("", 0, ERROR, 1, error="model step failed: boom", kind=ErrorKind.MODEL)]]]
    ),
    "chat_deadline": Scenario(
        [[[d("slow")]], [[d("", 0, ERROR, 1, error="deadline", kind=ErrorKind.DEADLINE)]]]
    ),
    "chat_grammar": Scenario(
        [[[d("{")]], [[d("", 0, ERROR, 1, error="GrammarViolation: x", kind=ErrorKind.GRAMMAR)]]]
    ),
    "chat_engine_dead": Scenario(
        [[[d("z")]], [[d("", 0, ERROR, 1, error="engine thread died", kind=ErrorKind.ENGINE_DEAD)]]]
    ),
    "chat_aborted": Scenario([[[d("q")]], [[d("", 0, ABORT, 1, error="drained")]]]),
    "chat_tools": Scenario(
        [
            [[d("Sure. ")]],
            [[d(TOOL[:20], done=2)]],
            [[d(TOOL[20:45], done=3)]],
            [[d(TOOL[45:], done=4)]],
            [[d("", 0, STOP, 5)]],
        ],
        tools=True,
        usage=True,
    ),
    "chat_cut_off": Scenario([[[d("a")]], [[d("b", done=2)]]], cut_off=True),
}


class Capture(asyncio.Transport):
    """A transport whose buffer is always empty: the direct path may always write."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False


async def settle() -> None:
    for _ in range(20):  # no I/O: a fixed number of loop turns lets every woken task run
        await asyncio.sleep(0)


async def _run(
    s: Scenario, fmt: EventFormat | None = None, direct: bool = True, write_last: bool = True
) -> bytes:
    """`fmt`: another API's format (default: the scenario's OpenAI chunks); `direct` off: every
    event goes through the pump (`piece`), never the fast path; `write_last` off: the dispatcher
    writes as it formats (an engine without handoff), not after its pass."""
    transport = Capture()

    async def write(data: bytes) -> None:  # aiohttp's own writes: the same chunked framing
        transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    ring: SpscRing[StepOutput] = SpscRing(64)
    disp = Dispatcher(ring, abort=lambda rid: None, max_buffered_tokens=10_000, write_last=write_last)
    stream = RequestStream("r", s.n)
    disp.register("r", stream)
    if fmt is None:
        chunks = ChunkFormat(
            s.chat,
            "chatcmpl-golden",
            1700000000,
            "golden-model",
            s.n,
            s.usage,
            TokenTexts(FakeTokenizer()),
            s.tools,
        )
        fmt = chunks
        head = chunks.role() if s.chat else chunks.echo(s.echo, s.n) if s.echo else b""
    else:
        head = fmt.head()
    cfg = StreamConfig(max_tokens_per_event=s.limit)
    tw = TransportWrite(transport, True) if direct else None
    task = asyncio.ensure_future(pump_sse(stream, fmt, Usage([3], s.n), write, cfg, head, tw))
    await settle()
    disp.attach(asyncio.get_running_loop())
    for step, pass_ in enumerate(s.passes):  # the steps of a pass are in the ring when it wakes
        for i, deltas in enumerate(pass_):
            ring.push(StepOutput(step * 10 + i, deltas))
        await settle()
    if s.cut_off:
        disp._cut_off(stream)
    await asyncio.wait_for(task, 10)
    disp.detach()
    return bytes(transport.data)


def wire(name: str, write_last: bool = True) -> str:
    body = asyncio.run(_run(SCENARIOS[name], write_last=write_last)).decode()
    return re.sub(r"call_[0-9a-f]{24}", "call_X", body)  # tool call ids are random


@pytest.mark.parametrize("write_last", [True, False])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_sse_bytes_equal_the_golden_copy(name: str, write_last: bool) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert wire(name, write_last) == golden[name]


def test_the_golden_copy_covers_every_scenario() -> None:
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(SCENARIOS)


# The Responses and Messages formats have no copy from before issue 25; their fast path
# (`text_parts`, taken for a plain delta inside an open message item / text block) must give the
# bytes their pump gives (`piece`), sequence numbers included.
OTHER_APIS = ["chat_plain", "chat_held_back", "chat_coalesced", "chat_logprobs", "chat_model_error"]
OTHER_APIS += ["chat_tools", "chat_cut_off", "chat_aborted"]
RANDOM_IDS = re.compile(r"(msg|call|fc|toolu)_[0-9a-f]{24,32}")


def other_api(api: str, tools: bool) -> EventFormat:
    if api == "responses":
        return ResponsesFormat("resp_golden", 1700000000, "golden-model", {"model": "golden-model"}, tools)
    return MessagesFormat("msg_golden", "golden-model", 3, tools)


@pytest.mark.parametrize("name", OTHER_APIS)
@pytest.mark.parametrize("api", ["responses", "messages"])
def test_the_fast_path_sends_the_pumps_bytes_on_every_api(api: str, name: str) -> None:
    s = SCENARIOS[name]
    taken: list[int] = []
    fast = other_api(api, s.tools)
    parts = fast.text_parts

    def spy(index: int, text: str) -> tuple[bytes, bytes, bytes] | None:
        got = parts(index, text)
        taken.append(got is not None)
        return got

    fast.text_parts = spy  # type: ignore[method-assign]
    direct = asyncio.run(_run(s, fast))
    pumped = asyncio.run(_run(s, other_api(api, s.tools), direct=False))
    assert RANDOM_IDS.sub("ID", direct.decode()) == RANDOM_IDS.sub("ID", pumped.decode())
    if name == "chat_plain":  # "lo" after "Hel" opened the item or block: a fast-path event
        assert taken == [False, True]
    if s.tools:
        assert not any(taken)


def _regenerate() -> None:  # by hand only (see the module docstring)
    GOLDEN.write_text(json.dumps({name: wire(name) for name in sorted(SCENARIOS)}, indent=1) + "\n")
