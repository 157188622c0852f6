"""`rillet config` / `rillet serve`: overrides, flags, exit code 2 naming the key, graceful drain."""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from faulty_rillet import LOAD_HOLD_S
from http_helpers import Resp, post, sse_events
from proc_helpers import REPO, RILLET, ServeProcess
from rillet.core.config import config_to_dict, load_config
from rillet.http.cli import build_parser, main, overrides_from


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_config_print_is_the_effective_config(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(capsys, "config", "--print")
    assert rc == 0 and yaml.safe_load(out) == config_to_dict(load_config())
    rc, out, _ = run_main(
        capsys,
        "config",
        "--print",
        "--config",
        str(REPO / "rillet.yaml"),
        "--set",
        "cache.block_size=32",
        "--set",
        "server.api_keys=[a, b]",
        "--set",
        "graphs.buckets=[1, 2]",
    )
    data = yaml.safe_load(out)
    assert rc == 0 and data["cache"]["block_size"] == 32
    assert data["server"]["api_keys"] == ["a", "b"] and data["graphs"]["buckets"] == [1, 2]


def test_shipped_example_config_names_every_key() -> None:
    text = (REPO / "rillet.yaml").read_text()
    assert yaml.safe_load(text) == config_to_dict(load_config())
    for section, keys in config_to_dict(load_config()).items():
        for key in keys:
            # each key is preceded by a comment line explaining it
            match = re.search(rf"\n( *)# [^\n]*\n(?: *#[^\n]*\n)*\1{key}:", text)
            assert match, f"{section}.{key} has no comment in rillet.yaml"


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--set", "cache.foo=1"], "cache.foo"),
        (["--set", "nosection.x=1"], "nosection"),
        (["--set", "cache.num_blocks=many"], "cache.num_blocks"),
        (["--set", "cache.block_size=7"], "cache.block_size"),
        (["--set", "stream.ring_capacity=1000"], "stream.ring_capacity"),
        (["--set", "server.port=70000"], "server.port"),
        (["--set", "justakey"], "justakey"),
    ],
)
def test_bad_config_exits_2_naming_the_key(
    capsys: pytest.CaptureFixture[str], args: list[str], key: str
) -> None:
    rc, out, err = run_main(capsys, "config", *args)
    assert rc == 2 and out == ""
    assert f"'{key}'" in err and err.count("\n") == 1


def test_bad_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("cache:\n  block_size: [\n")
    rc, _, err = run_main(capsys, "config", "--config", str(bad))
    assert rc == 2 and "--config" in err
    typo = tmp_path / "typo.yaml"
    typo.write_text("scheduler:\n  max_num_seq: 4\n")
    rc, _, err = run_main(capsys, "config", "--config", str(typo))
    assert rc == 2 and "scheduler.max_num_seq" in err and "max_num_seqs" in err
    rc, _, err = run_main(capsys, "config", "--config", str(tmp_path / "missing.yaml"))
    assert rc == 2 and "cannot read" in err


def test_serve_flags_map_to_config_keys() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "/m/x.gguf",
            "--host",
            "0.0.0.0",
            "--port",
            "9001",
            "--api-key",
            "k1",
            "--api-key",
            "k2",
            "--dtype",
            "bfloat16",
            "--log-level",
            "debug",
            "--set",
            "server.port=1",
        ]
    )
    cfg = load_config(None, overrides_from(args))
    assert cfg.model.path == "/m/x.gguf" and cfg.model.dtype == "bfloat16"
    assert (cfg.server.host, cfg.server.port) == ("0.0.0.0", 9001)  # flags win over --set
    assert cfg.server.api_keys == ("k1", "k2") and cfg.logging.level == "DEBUG"


def test_vllm_flag_names_map_to_config_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """A vLLM command line carries over: --served-model-name, --max-model-len,
    --tensor-parallel-size, --scheduling-policy and --lora-modules in both of its forms."""
    lora = ["sql=/a/sql", '{"name": "acme/chat", "path": "/a/chat", "base_model_name": "x"}']
    flags = ["--served-model-name", "smol", "--max-model-len", "2048", "--tensor-parallel-size", "3"]
    flags += ["--scheduling-policy", "priority"]
    args = build_parser().parse_args(["serve", *flags, "--lora-modules", *lora])
    cfg = load_config(None, overrides_from(args))
    assert (cfg.model.served_name, cfg.model.max_model_len) == ("smol", 2048)
    assert cfg.parallel.tensor_parallel_size == 3 and cfg.scheduler.policy == "priority"
    assert cfg.lora.adapters == {"sql": "/a/sql", "acme/chat": "/a/chat"}
    for bad in ("sql", '{"name": "x"}', "{oops"):
        rc, _, err = run_main(capsys, "serve", "--lora-modules", bad)
        assert rc == 2 and "'lora.adapters'" in err and err.count("\n") == 1


def test_serve_with_bad_flags_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_main(capsys, "serve", "--dtype", "float64")
    assert rc == 2 and "'model.dtype'" in err
    rc, _, err = run_main(capsys, "serve", "--scheduling-policy", "lifo")
    assert rc == 2 and "'scheduler.policy'" in err
    rc, _, err = run_main(capsys, "serve", "--port", str(1 << 70))  # past 64 bits: no traceback
    assert rc == 2 and "'server.port'" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--port", "eighty"])
    assert exc.value.code == 2


def test_console_script_runs() -> None:
    r = subprocess.run(
        [str(RILLET), "config", "--print", "--set", "server.max_n=3"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["server"]["max_n"] == 3


class _Served(ServeProcess):
    """`rillet serve` (synthetic model) on a free port, with the requests these tests make."""

    def __init__(self, *sets: str) -> None:
        super().__init__("model.max_model_len=512", *sets)

    def post(self, body: dict[str, Any]) -> Resp:
        return post(self, "/v1/completions", body)  # type: ignore[arg-type]

    def stream(self, body: dict[str, Any], started: threading.Event, out: list[bytes]) -> None:
        """Streams a completion into `out`; sets `started` once the first event arrived."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(
                "POST",
                "/v1/completions",
                orjson.dumps({**body, "stream": True}),
                {"Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            out.append(resp.readline())
            started.set()
            out.append(resp.read())
        except (OSError, http.client.HTTPException):  # the server was made to die mid-stream
            started.set()
        finally:
            conn.close()


LONG = {"model": "synthetic", "prompt": "drain me", "ignore_eos": True}


def test_sigterm_drains_in_flight_requests_then_exits_0() -> None:
    srv = _Served("model.synthetic_step_ms=10")
    try:
        started, out = threading.Event(), []
        # 200 steps of >= 10 ms: the stream outlives the signal's handling and the refused request
        t = threading.Thread(target=srv.stream, args=({**LONG, "max_tokens": 200}, started, out))
        t.start()
        assert started.wait(30)
        srv.proc.send_signal(signal.SIGTERM)
        srv.wait_for_line("in-flight requests", 30)  # logged once the server is draining
        refused = srv.post({"model": "synthetic", "prompt": "late", "max_tokens": 2})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        t.join(30)
        events = sse_events(b"".join(out))
        assert events[-1] == "[DONE]"
        assert sum(len(e["choices"]) for e in events[:-1] if e["choices"][0]["text"]) > 0
        assert events[-2]["choices"][0]["finish_reason"] == "length"  # ran to its end
        assert srv.proc.wait(30) == 0
        log = srv.log
        assert "loading" in log and "stopped" in log
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def test_a_stop_while_the_model_loads_exits_0_at_once() -> None:
    """The loading thread cannot be stopped (inside torch, finalizing the interpreter under it
    aborted the process: SIGABRT, 134): the process ends at once, 0, after saying why."""
    srv = ServeProcess("model.max_model_len=512", faults={LOAD_HOLD_S: "120"}, ready=False)
    try:
        srv.wait_for_line("503 until the model is loaded", 60)
        srv.proc.send_signal(signal.SIGINT)
        assert srv.proc.wait(30) == 0
        assert "stopped while loading" in srv.log
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def test_second_signal_exits_at_once() -> None:
    srv = _Served("model.synthetic_step_ms=50")
    try:
        started: threading.Event = threading.Event()
        out: list[bytes] = []
        threading.Thread(
            target=srv.stream, args=({**LONG, "max_tokens": 400}, started, out), daemon=True
        ).start()
        assert started.wait(30)
        srv.proc.send_signal(signal.SIGINT)  # drain: the stream has >= 20 s to go
        srv.wait_for_line("draining (again to exit at once)", 30)
        os.kill(srv.proc.pid, signal.SIGINT)
        # A drain would end 0 after the stream's 20 s; exit code 1 is the immediate exit.
        assert srv.proc.wait(15) == 1
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def test_compile_says_why_when_there_is_nothing_to_save(capsys: pytest.CaptureFixture[str]) -> None:
    """`rillet compile` for a config whose decode step is not compiled and saved on CPU: one line
    saying why, exit 0 (a container build script can run it for any config)."""
    rc, out, _ = run_main(capsys, "compile", "--set", "model.kind=synthetic", "--set", "model.device=cpu")
    assert rc == 0 and out.startswith("rillet compile: nothing to compile ahead: the synthetic model")
    rc, out, _ = run_main(capsys, "compile", "--set", "graphs.artifacts=off", "--set", "model.device=cpu")
    assert rc == 0 and "graphs.artifacts is off" in out
    rc, _, err = run_main(capsys, "compile", "--set", "graphs.artifacts=maybe")
    assert rc == 2 and "graphs.artifacts" in err


def test_an_unwritable_cache_dir_is_one_line_naming_the_key(
    capsys: pytest.CaptureFixture[str], tiny_hf_model: Any, tmp_path: Path
) -> None:
    """A model.cache_dir that cannot be created (here under a file; a read-only home or volume
    alike) was a traceback from `rillet compile` and "could not load the model: FileNotFoundError"
    with exit 1 from `rillet serve`: now one line naming the key, exit 2, before any compile."""
    folder, _ = tiny_hf_model("llama")
    capsys.readouterr()  # the folder's saving progress bar
    (tmp_path / "file").write_text("")
    sets = [f"model.path={folder}", "model.dtype=float32", "model.device=cpu", "graphs.enabled=on"]
    sets.append(f"model.cache_dir={tmp_path / 'file' / 'cache'}")
    rc, _, err = run_main(capsys, "compile", *[a for s in sets for a in ("--set", s)])
    assert rc == 2 and "'model.cache_dir'" in err and err.count("\n") == 1
