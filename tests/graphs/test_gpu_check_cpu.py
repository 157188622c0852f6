"""bench/gpu/check.py on the CPU, so the one GPU check cannot rot between GPU leases.

The smoke run executes every part with tiny shapes (torch attention, no graphs): argument parsing,
the HTTP client subprocess, JSON writing and the table printed last. The rest checks the pieces the
GPU run depends on: FAIL / SKIP handling, the greedy and logits comparisons, the GPU plan's config
overrides and sizes, and the tokenizer-only GGUF that replaces the default model there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from repo import REPO
from rillet.core.config import load_config
from rillet.core.llm import CompletionOutput
from rillet.core.sequence import TokenLogprob

import bench.gpu.check as gpu_check
import bench.gpu.plan as gpu_plan
import bench.gpu.results as gpu_results
from bench.gpu.greedy import compare_greedy, rejudge
from bench.gpu.logits import logit_stats


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    cmd = [sys.executable, "-m", "bench.gpu.check", "--cpu-smoke", "--out", str(out)]
    # the timeout only bounds a hang: the smoke run took ~35 s on a loaded 2-core box
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    return proc, json.loads(out.read_text())


def test_smoke_runs_every_part_and_prints_the_table_last(smoke: tuple) -> None:
    proc, data = smoke
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    names = [
        "copy bandwidth",
        "build 7B engine",
        "(b) batch-1 decode",
        "(c) batch-64 decode",
        "(d) stream vs non-stream",
        "(a) greedy 7B",  # the 7B engine still serves LLM.generate after the HTTP server of (d)
        "(e) verify step",
        "(g) spec speed 7B",
        "(f) spec engine",
        "(a) logits 7B",
        "(a) logits default",
        "(a) greedy default",
    ]
    assert list(data["parts"]) == names == [name for name, _, _ in gpu_plan.PARTS]
    assert all(p["status"] == "OK" for p in data["parts"].values()), data["parts"]
    lines = proc.stdout.strip().splitlines()
    assert lines[1].split() == ["part", "measured", "target", "floor", "/", "ref", "verdict", "note"]
    assert lines[-1].startswith("memory / time")
    verdicts = {r["part"]: r["verdict"] for r in data["table"]}
    judged = ("(a) logits 7B", "(a) logits default", "(a) greedy 7B", "(a) greedy default", "(f) spec engine")
    for name in judged:
        assert verdicts[name] == "PASS"
    assert "FAIL" not in verdicts.values()


def test_smoke_numbers_are_complete(smoke: tuple) -> None:
    parts = smoke[1]["parts"]
    assert parts["(a) greedy 7B"]["exact"] == len(gpu_plan.make_plan(True, None).greedy_lens)
    levels = parts["(d) stream vs non-stream"]["levels"]
    assert [lv.get("api", "chat") for lv in levels] == ["chat"] * 2 + ["responses"] * 2 + ["messages"] * 2
    for level in levels:
        tokens = level["tokens"]
        assert tokens["stream"] == tokens["nonstream"] == tokens["expected_each"] and level["errors"] == 0
    b = parts["(b) batch-1 decode"]
    assert b["step"]["step_ms"] > 0 and b["engine"]["decoded"] == b["engine"]["new_tokens"]
    spec = parts["(f) spec engine"]  # outputs kept to the prompts' alphabet: the drafter proposes
    assert spec["exact"] == len(spec["details"]) and spec["drafted"] > 0
    speed = parts["(g) spec speed 7B"]
    assert speed["drafted"] > 0 and speed["spec"]["decoded"] == speed["plain"]["decoded"] > 0
    c = parts["(c) batch-64 decode"]
    assert c["engine"]["decoded"] == c["engine"]["rows"] * c["engine"]["new_tokens"]
    assert c["step"]["bytes_per_step"] > b["step"]["bytes_per_step"]  # more rows, more KV


def _results(tmp_path: Path, budget_s: float) -> gpu_results.Results:
    return gpu_results.Results(tmp_path / "r.json", gpu_plan.make_plan(True, budget_s))


def test_a_failing_part_is_marked_and_the_next_still_runs(tmp_path: Path) -> None:
    res = _results(tmp_path, 60)

    def boom() -> gpu_plan.Part:
        raise RuntimeError("no kernel for you")

    assert gpu_results.run_part(res, "broken", 0, boom) is None
    ok = gpu_results.run_part(res, "fine", 0, lambda: gpu_plan.Part({"x": 1}, [gpu_plan.row("fine", "1")], 7))
    assert ok == 7
    data = json.loads((tmp_path / "r.json").read_text())
    assert (
        data["parts"]["broken"]["status"] == "FAIL"
        and "no kernel for you" in data["parts"]["broken"]["error"]
    )
    assert data["parts"]["fine"]["x"] == 1
    assert [r["verdict"] for r in res.rows] == ["FAIL", "INFO"]
    assert "no kernel for you" in res.report()


def test_a_part_the_budget_cannot_fit_is_skipped(tmp_path: Path) -> None:
    res = _results(tmp_path, 10)
    assert gpu_results.run_part(res, "slow", 30, lambda: pytest.fail("must not start")) is None
    assert res.parts["slow"]["status"] == "SKIP" and res.rows[0]["verdict"] == "SKIP"
    assert json.loads((tmp_path / "r.json").read_text())["parts"]["slow"]["status"] == "SKIP"


def test_every_part_is_on_disk_when_the_next_one_starts(tmp_path: Path) -> None:
    """A device call cut short still returns every part that finished: each writes the JSON."""
    res = _results(tmp_path, 60)
    seen: list[list[str]] = []

    def part(value: int) -> gpu_plan.Part:
        seen.append(list(json.loads((tmp_path / "r.json").read_text())["parts"]))
        if value == 2:
            raise RuntimeError("boom")
        return gpu_plan.Part({"v": value}, [])

    gpu_results.run_part(res, "one", 0, lambda: gpu_plan.Part({"v": 0}, []))
    gpu_results.run_part(res, "two", 0, lambda: part(1))
    gpu_results.run_part(res, "three", 0, lambda: part(2))
    gpu_results.run_part(res, "four", 999, lambda: part(3))  # skipped
    gpu_results.run_part(res, "five", 0, lambda: part(4))
    assert seen == [["one"], ["one", "two"], ["one", "two", "three", "four"]]


def test_the_budget_counts_the_setup_before_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu_run.sh exports GPU_RUN_START before installing the kit; that time is inside the budget."""
    monkeypatch.setenv("GPU_RUN_START", str(time.time() - 50))
    setup = gpu_results.setup_seconds()
    assert 50 <= setup < 50 + 30
    res = gpu_results.Results(tmp_path / "r.json", gpu_plan.make_plan(True, 60), setup_s=setup)
    assert res.elapsed() >= 50 and res.time_left() <= 10
    assert gpu_results.run_part(res, "needs 20", 20, lambda: pytest.fail("must not start")) is None
    res.write()
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["setup_s"] == setup
    monkeypatch.delenv("GPU_RUN_START")
    assert gpu_results.setup_seconds() == 0.0


def test_only_runs_the_selected_parts(tmp_path: Path) -> None:
    res = _results(tmp_path, 60)
    gpu_check.run_all(res, {"bw"})
    assert list(res.parts) == ["copy bandwidth"] and res.parts["copy bandwidth"]["tb_s"] > 0


def test_d_reads_the_engine_per_mode_and_runs_the_gate_variants_on_one_engine(tmp_path: Path) -> None:
    res = _results(tmp_path, 300)
    gpu_check.run_all(res, {"d"}, d_apis=[], d_gates=["off", "last", "none", "depth2", "depth2-none"])
    levels = res.parts["(d) stream vs non-stream"]["levels"]
    assert [lv.get("api", "chat") for lv in levels] == ["chat"] * 2  # --d-apis with none: chat only
    for lv in levels:
        for key in ("host_ms_per_step", "wall_ms_per_step", "loop_us_per_token", "client_us_per_token"):
            assert all(v is not None and v > 0 for v in lv[key].values()), (key, lv[key])
        assert lv["device_busy_ms_per_step"] == {"nonstream": 0.0, "stream": 0.0}  # CUDA only
    for variant in ("off", "last"):  # last: the writes held to each pass's end (a CPU model's anyway)
        part = res.parts[f"(d) engine gate {variant}"]
        assert part["gate"] == variant and len(part["levels"]) == 2
        assert all(lv["errors"] == 0 for lv in part["levels"])
    # a CPU model's launch runs the model: no device wait to give way in (resolve_gate refuses it)
    assert res.parts["(d) engine gate none"]["gate"] == "none"
    verdicts = {r["part"]: r["verdict"] for r in res.rows}
    assert verdicts["(d) gate none"] == "SKIP"
    assert verdicts["(d) gate depth2"] == "SKIP"  # a CPU model runs no steps in flight to deepen
    assert verdicts["(d) gate depth2-none"] == "SKIP"


def test_d_variants_name_a_depth_and_a_gate_probe() -> None:
    from bench.gpu.parts import d_variant

    assert d_variant("off") == d_variant("last") == (None, None)
    assert d_variant("none") == (None, "none")
    assert d_variant("depth2") == (2, None)
    assert d_variant("depth2-none") == (2, "none") and d_variant("depth2-device") == (2, "device")


def _out(tokens: list[int], lps: list[float], tops: list[list[tuple[int, float]]]) -> CompletionOutput:
    lp = [TokenLogprob(t, v, top) for t, v, top in zip(tokens, lps, tops, strict=True)]
    return CompletionOutput(0, token_ids=tokens, logprobs=lp)


def test_compare_greedy_tells_ties_from_mismatches() -> None:
    top = [[(5, -1.0), (6, -1.05)], [(7, -0.5), (8, -3.0)], [(9, -0.2)]]
    eager = _out([5, 7, 9], [-1.0, -0.5, -0.2], top)
    same = _out([5, 7, 9], [-1.01, -0.52, -0.2], top)
    tie = _out([6, 1, 1], [-1.05, -1.0, -1.0], top)  # 6 was 0.05 nats behind eager's 5
    wrong = _out([5, 8, 1], [-1.0, -3.0, -1.0], top)  # 8 was 2.5 nats behind
    r = compare_greedy([eager, eager, eager], [same, tie, wrong], tie_tol=0.1, lp_tol=0.25)
    assert (r["exact"], r["tie"], r["mismatch"], r["ok"]) == (1, 1, 1, False)
    assert r["details"][2]["step"] == 1 and r["max_dlogprob"] == pytest.approx(0.02)
    assert compare_greedy([eager, eager], [same, tie], 0.1, 0.25)["ok"]
    assert not compare_greedy([eager], [same], 0.1, 0.001)["ok"]  # logprobs drifted
    failed = CompletionOutput(0, error="model step failed")
    assert compare_greedy([eager], [failed], 0.1, 0.25)["error"] == 1


def test_rejudge_widens_ties_to_the_measured_bf16_noise() -> None:
    """A gap beyond 0.1 nats but inside transformers' own bf16 logit error counts as a tie; one
    beyond that error stays a mismatch; without the logits part nothing changes."""
    top = [[(5, -1.0), (6, -1.3)], [(7, -0.5), (8, -3.0)]]
    eager = _out([5, 7], [-1.0, -0.5], top)
    near = _out([6, 1], [-1.3, -1.0], top)  # 0.3 nats behind
    far = _out([7, 8], [-0.5, -3.0], [top[1], top[1]])  # diverges at step 1, 2.5 nats behind
    r = compare_greedy([eager, eager], [near, _out([5, 8], [-1.0, -3.0], top)], 0.1, 0.25)
    assert (r["tie"], r["mismatch"]) == (0, 2) and far.token_ids
    parts = {"(a) greedy 7B": {"status": "OK", "replays": 3, **r}}
    rows = [{"part": "(a) greedy 7B", "measured": "", "verdict": "FAIL", "note": ""}]
    rejudge(parts, rows, "7B", judged=True)  # no logits part: unchanged
    assert rows[0]["verdict"] == "FAIL" and parts["(a) greedy 7B"]["mismatch"] == 2
    parts["(a) logits 7B"] = {"status": "OK", "hf_bf16_vs_fp32": {"max_abs": 0.5}}
    rejudge(parts, rows, "7B", judged=True)
    g = parts["(a) greedy 7B"]
    assert (g["tie"], g["mismatch"], g["ok"], g["tie_tol"]) == (1, 1, False, 0.5)
    assert rows[0]["verdict"] == "FAIL" and rows[0]["measured"] == "0/2 exact, 1 ties"
    parts["(a) logits 7B"]["hf_bf16_vs_fp32"]["max_abs"] = 3.0
    rejudge(parts, rows, "7B", judged=True)
    assert parts["(a) greedy 7B"]["ok"] and rows[0]["verdict"] == "PASS"


def test_logit_stats_sees_a_wrong_model() -> None:
    ref = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    close = logit_stats(ref + 1e-3 * torch.randn_like(ref), ref)
    assert close["rel_err"] < 1e-2 and close["top1_agree"] == 1.0 and close["finite"]
    assert logit_stats(torch.randn_like(ref), ref)["rel_err"] > 0.5
    assert not logit_stats(ref.clone().fill_(float("nan")), ref)["finite"]


def test_gpu_plan_overrides_are_valid_config() -> None:
    p = gpu_plan.make_plan(False, None)
    cfg = load_config(None, gpu_plan.overrides(p, p.big_shape, True, p.big_buckets, p.big_blocks))
    assert (cfg.graphs.enabled, cfg.graphs.buckets, cfg.attention.backend) == (
        "on",
        p.big_buckets,
        "flashinfer",
    )
    assert (cfg.model.device, cfg.model.dtype, cfg.scheduler.max_num_seqs) == ("cuda", "bfloat16", 64)
    assert cfg.attention.flashinfer_prefill_backend == "fa2"  # FA3 modules are not in the kit's cache
    eager = load_config(None, gpu_plan.overrides(p, p.small_shape, False, p.small_buckets, 512, "none"))
    assert (eager.graphs.enabled, eager.graphs.compile_mode) == ("off", "none")


def test_gpu_plan_sizes_fit() -> None:
    p = gpu_plan.make_plan(False, None)
    assert p.big_arch.hidden_size == 4096 and p.big_arch.architecture == "mistral"
    assert p.c_rows == 64 and 1000 <= p.c_context <= 1100 and p.d_concurrency == (1, 8, 64)
    per_seq = -(-(p.c_context + p.c_new) // 16)
    assert 1 + p.c_rows * per_seq < p.big_blocks  # microbenchmark and engine run of (c) fit the pool
    assert p.c_context + p.c_new < p.max_model_len and max(p.greedy_lens) + 64 < p.max_model_len
    # counted from the device command's start: the watchdog exits with time left to copy files back
    assert p.budget_s + p.grace_s + gpu_plan.EXIT_S <= gpu_plan.DEVICE_LIMIT_S == 420
    # the parts that answer the targets fit after the setup even at their expected seconds; the
    # rest come last and run on what is left
    target = gpu_plan.PARTS[: gpu_plan.TARGET_PARTS]
    assert [key for _, key, _ in target] == ["bw", "build", "b", "c", "d", "greedy7b"]
    assert gpu_plan.SETUP_S + sum(need for _, _, need in target) <= p.budget_s
    assert {key for _, key, _ in gpu_plan.PARTS} == set(gpu_check.PART_KEYS)


def test_gpu_run_passes_the_budget_clock_and_collects_flashinfer_logs() -> None:
    """bench/gpu/run.sh (the device command) as text: what it hands bench.gpu.check and brings back."""
    text = (REPO / "bench" / "gpu" / "run.sh").read_text()
    assert "export GPU_RUN_START=" in text.split("source .gpu/install.sh")[0]  # before the install
    assert "FLASHINFER_JIT_BUILD_LOG=" in text and "flashinfer_jit.log" in text


def test_tokenizer_only_gguf_matches_the_default_model(tmp_path: Path) -> None:
    from rillet.core.loaders.default_model import default_model_path
    from rillet.core.tokenizer.tokenizer import Tokenizer

    path = tmp_path / "tok.gguf"
    size = gpu_plan.write_tokenizer_gguf(path)
    assert size == path.stat().st_size < 3 << 20
    small, full = Tokenizer.from_gguf(path), Tokenizer.from_gguf(default_model_path())
    text = "Hello, world! <|im_end|> ünïcödé 12345"
    assert small.encode(text) == full.encode(text)
    assert small.chat_template == full.chat_template and small.eos_token_ids == full.eos_token_ids
