"""`rillet serve` from the outside: graceful drain of 16 streams on SIGTERM, a non-zero exit when the
engine dies (never a hang), exit 2 for a bad model path."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from faulty_rillet import DIE_AFTER_STEPS
from proc_helpers import REPO, RILLET, ServeProcess
from rel_helpers import COMP, fetch, send, stream_text

STREAMS = 16


async def _stream(port: int, body: dict[str, Any], started: asyncio.Queue[int]) -> list[Any]:
    raw = await send(port, COMP, {**body, "stream": True, "stream_options": {"include_usage": True}})
    await raw.read_head()
    assert raw.status == 200
    events = []
    async for _, e in raw.events():
        if not events:
            started.put_nowait(1)
        events.append(e)
    raw.close()
    return events


def test_sigterm_drains_16_in_flight_streams_then_exits_0() -> None:
    srv = ServeProcess("model.synthetic_step_ms=10", "server.drain_timeout_s=30")
    try:
        # 200 steps of >= 10 ms: the streams outlive the signal's handling and the refused request
        body = {"model": "synthetic", "max_tokens": 200, "ignore_eos": True}

        async def run() -> tuple[list[list[Any]], int]:
            started: asyncio.Queue[int] = asyncio.Queue()
            tasks = [
                asyncio.create_task(_stream(srv.port, {**body, "prompt": f"drain {i}"}, started))
                for i in range(STREAMS)
            ]
            for _ in range(STREAMS):
                await asyncio.wait_for(started.get(), 30)  # every stream is generating
            srv.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(srv.wait_for_line, "waiting up to", 30)  # the server is draining
            refused, _ = await fetch(srv.port, COMP, {**body, "prompt": "too late", "max_tokens": 2})
            return await asyncio.wait_for(asyncio.gather(*tasks), 60), refused

        streams, refused = asyncio.run(run())
        assert refused == 503  # draining: no new work
        for events in streams:
            assert events[-1] == "[DONE]" and all("error" not in e for e in events[:-1])
            assert events[-2]["usage"]["completion_tokens"] == 200  # ran to its end
            assert events[-3]["choices"][0]["finish_reason"] == "length"
            assert len(stream_text(events)[0]) > 0
        assert srv.wait(30) == 0  # drained within drain_timeout_s: no stream was cut (above)
        assert "waiting up to" in srv.log and "stopped" in srv.log
    finally:
        srv.kill()


def test_engine_death_exits_non_zero_after_telling_the_clients() -> None:
    srv = ServeProcess(
        "model.synthetic_step_ms=10",
        "scheduler.max_num_seqs=1",
        faults={DIE_AFTER_STEPS: "40"},
    )
    try:
        body = {"model": "synthetic", "max_tokens": 200, "ignore_eos": True}

        async def run() -> list[list[Any]]:
            started: asyncio.Queue[int] = asyncio.Queue()
            # One runs, one waits in the queue (max_num_seqs=1): both must hear of the death.
            tasks = [_stream(srv.port, {**body, "prompt": f"doomed {i}"}, started) for i in range(2)]
            return await asyncio.wait_for(asyncio.gather(*tasks), 30)

        streams = asyncio.run(run())
        for events in streams:
            assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "dead", events[-2:]
        assert srv.wait(20) == 1  # exits by itself, non-zero (the bound only catches a hang)
        assert "engine thread died" in srv.log and "exiting" in srv.log
    finally:
        srv.kill()


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda tmp: tmp / "missing.gguf", "does not exist"),
        (lambda tmp: tmp, "not a Hugging Face folder"),
        (lambda tmp: _write(tmp / "fake.gguf", b"this is no model"), "not a GGUF file"),
        (
            lambda tmp: _write(tmp / "config.json", b'{"model_type": "gpt2"}').parent,
            "model_type 'gpt2' is not supported (supported: llama, mistral, qwen2, qwen3, gemma2, ",
        ),
        (
            lambda tmp: _falcon_gguf(tmp / "falcon.gguf"),
            "GGUF architecture 'falcon' is not supported (supported: llama, qwen2, qwen3, qwen3moe, gemma2, ",
        ),
    ],
    ids=["missing", "folder", "not-gguf", "unsupported-hf", "unsupported-gguf"],
)
def test_bad_model_path_exits_2_with_a_clear_message(tmp_path: Path, make: Any, why: str) -> None:
    path = make(tmp_path)
    r = subprocess.run(
        [str(RILLET), "serve", "--port", "0", "--model", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("rillet: error: config key 'model.path'") and why in last, r.stderr
    assert "listening" not in r.stderr  # refused before the port was opened


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _falcon_gguf(path: Path) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "falcon")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
