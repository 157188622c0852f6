"""The parts of bench/gpu/check.py: each runs its measurement, judges it against its target and
returns a `Part` (JSON data and table rows). Greedy-token comparison (graphs vs eager) lives here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rillet.core.llm import LLM, CompletionOutput
from rillet.core.model.arch import ModelArch
from rillet.core.sampling_params import SamplingParams

from bench.gpu.greedy import compare_greedy
from bench.gpu.logits import compare_logits
from bench.gpu.plan import (
    B_TARGET_MS,
    C_TARGET_TOK_S,
    D_TARGET_RATIO,
    LOGITS_FLOOR,
    LOGPROB_TOL,
    README_COPY_TB_S,
    TIE_TOL,
    Part,
    Plan,
    free_memory,
    overrides,
    row,
    verdict,
)
from bench.gpu.timing import copy_bandwidth, engine_decode_rate, random_ids, step_timing
from bench.lib.common import REPO

# ModelRunner.step on a fixed batch, synchronously: host prep, replay, logits, sample, then the
# next step. The engine (the target's row) overlaps the host prep of step N+1 with step N's replay
# (issue 14), so the step row only says how much host time there is to hide.
STEP_NOTE = "runner.step, no overlap"
PROBES = ("device", "clock", "none")  # the engine gate's probes (stream.engine_first_probe)


def d_variant(name: str) -> tuple[int | None, str | None]:
    """(d)'s variant -> (engine.overlap_depth to run at or None: as built, the gate's probe or None:
    gate off). `off`, `last` (gate off, the old write order), a probe, `depth2`, `depth2-<probe>`."""
    depth, _, probe = name.partition("-") if name.startswith("depth") else ("", "", name)
    return (int(depth[len("depth") :]) if depth else None), (probe if probe in PROBES else None)


def graph_stats(llm: LLM) -> dict[str, Any]:
    gr = getattr(llm.engine.runtime.runner, "graph_runner", None)
    if gr is None:
        return {"graphs": False}
    return {
        "graphs": True,
        "captured": list(gr.captured_buckets),
        "replays": gr.num_replays,
        "padded_eager": gr.num_padded_eager,
        "eager": gr.num_eager,
        "verify_runs": gr.num_verify_runs,  # speculative verify steps through a graph
    }


def greedy_outputs(llm: LLM, prompts: list[list[int]], max_tokens: Sequence[int]) -> list[CompletionOutput]:
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=5) for m in max_tokens]
    return [r.outputs[0] for r in llm.generate(prompts, params)]


# ---- parts ------------------------------------------------------------------------------------------


def part_env_and_bandwidth(p: Plan) -> Part:
    import platform

    import transformers

    env: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__}
    env["python"] = platform.python_version()
    if p.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        t0 = time.perf_counter()
        import flashinfer  # ~7 s on the GPU machine: paid here, not inside a timed part

        env["flashinfer"] = getattr(flashinfer, "__version__", "?")
        env["flashinfer_import_s"] = time.perf_counter() - t0
    bw = copy_bandwidth(torch.device(p.device), p.bw_bytes)
    ref = f"README {README_COPY_TB_S} TB/s" if p.device == "cuda" else ""
    rate = f"{bw['tb_s']:.2f} TB/s" if bw["tb_s"] >= 0.1 else f"{bw['tb_s'] * 1e3:.1f} GB/s"
    note = f"{bw['bytes_per_copy'] >> 20} MiB copy, read+write"
    return Part({"env": env, **bw}, [row("copy bandwidth", rate, "", ref, note=note)], bw["tb_s"])


def part_logits(p: Plan, label: str, arch: ModelArch) -> Part:
    r = compare_logits(
        arch, torch.device(p.device), p.attention, p.logit_prompt, p.logit_decode, 0, p.prefill_kernels
    )
    ours, hf = r["rillet_vs_fp32"], r["hf_bf16_vs_fp32"]
    bound = max(2 * hf["rel_err"], LOGITS_FLOOR)
    ok = ours["finite"] and ours["rel_err"] <= bound
    measured = f"rel {ours['rel_err']:.1e}, top1 {ours['top1_agree']:.2f}"
    note = f"vs fp32 HF; {p.logit_prompt - p.logit_decode} prefill + {p.logit_decode} decode, {p.attention}"
    rows = [
        row(
            f"(a) logits {label}",
            measured,
            f"rel <= {bound:.1e}",
            f"HF bf16 {hf['rel_err']:.1e}",
            verdict(ok),
            note,
        )
    ]
    return Part(r, rows)


def open_engine(
    p: Plan, role: str, graphs: bool, compile_mode: str = "default", extra: Sequence[str] = ()
) -> LLM:
    shape, buckets = (p.big_shape, p.big_buckets) if role == "7B" else (p.small_shape, p.small_buckets)
    blocks = p.big_blocks if role == "7B" and graphs else p.small_blocks
    return LLM(overrides=[*overrides(p, shape, graphs, buckets, blocks, compile_mode), *extra])


# (compile_mode, graphs): when compiling fails, capture the plain forward; when capturing fails,
# run eager, so one failure still leaves (b), (c) and (d) measured (the build row says FAIL).
BUILD_FALLBACKS = (("default", True), ("none", True), ("none", False))


def part_build(p: Plan, time_left: Callable[[], float]) -> Part:
    errors: list[str] = []
    for mode, graphs in BUILD_FALLBACKS:
        if errors and time_left() < 60 * p.scale:
            break
        t0 = time.perf_counter()
        try:
            llm = open_engine(p, "7B", graphs, mode)
        except Exception as exc:
            errors.append(f"compile_mode={mode} graphs={graphs}: {type(exc).__name__}: {exc}")
            free_memory(p)
            continue
        secs = time.perf_counter() - t0
        stats = graph_stats(llm)
        ok = not errors and (stats["graphs"] or p.device != "cuda")
        note = f"buckets {stats.get('captured', 'none')}, compile_mode {mode}"
        if errors:
            note += f"; fell back after: {errors[0][:80]}"
        data = {"seconds_to_ready": secs, "compile_mode": mode, "errors": errors, **stats}
        return Part(data, [row("build 7B engine", f"{secs:.0f} s", "", "", verdict(ok), note)], (llm, mode))
    raise RuntimeError("; ".join(errors))


def part_greedy(p: Plan, role: str, graph_llm: LLM | None, compile_mode: str) -> Part:
    """Greedy tokens of the graphs engine (given, or built here) against an eager engine."""
    own = graph_llm is None
    eager = None
    try:
        if graph_llm is None:
            graph_llm = open_engine(p, role, True, compile_mode)
        eager = open_engine(p, role, graphs=False)
        arch = p.big_arch if role == "7B" else p.small_arch
        gen = torch.Generator().manual_seed(5)
        prompts = [random_ids(n, arch.vocab_size, gen) for n in p.greedy_lens]
        before = graph_stats(graph_llm)
        got = greedy_outputs(graph_llm, prompts, p.greedy_max_tokens)
        want = greedy_outputs(eager, prompts, p.greedy_max_tokens)
        after = graph_stats(graph_llm)
    finally:
        if eager is not None:
            eager.close()
        if own and graph_llm is not None:
            graph_llm.close()
        free_memory(p)
    r = compare_greedy(want, got, TIE_TOL, LOGPROB_TOL)
    replays = after.get("replays", 0) - before.get("replays", 0)
    ok = r["ok"] and (replays > 0 or p.device != "cuda")
    measured = f"{r['exact']}/{r['prompts']} exact, {r['tie']} ties"
    note = f"{replays} graph replays; max dlogprob {r['max_dlogprob']:.3f}"
    return Part(
        {**r, "graphs": after, "replays": replays},
        [row(f"(a) greedy {role}", measured, "equal", "eager", verdict(ok), note)],
    )


def part_b(p: Plan, llm: Any, tb_s: float | None) -> Part:
    bw = tb_s or README_COPY_TB_S
    t = step_timing(llm, 1, p.b_context, p.iters, p.warmup)
    prompt = random_ids(p.b_prompt, p.big_arch.vocab_size, torch.Generator().manual_seed(11))
    e = engine_decode_rate(llm, [prompt], p.b_new)
    floor = t["bytes_per_step"] / bw / 1e9
    ref, tgt = f"{floor:.2f} ms", f"<= {B_TARGET_MS} ms"
    engine_ok = e["ms_per_step"] <= B_TARGET_MS and not e["errors"]  # the target: decode as served
    rows = [
        row("(b) b=1 step", f"{t['step_ms']:.2f} ms", "", ref, "INFO", STEP_NOTE),
        row(
            "(b) b=1 engine", f"{e['ms_per_step']:.2f} ms", tgt, ref, verdict(engine_ok, p.judged), "generate"
        ),
    ]
    if t["replay_ms"] is not None:
        rows.append(row("(b) b=1 replay", f"{t['replay_ms']:.2f} ms", "", ref, note="graph only, no lm_head"))
    return Part({"step": t, "engine": e, "floor_ms": floor, "copy_tb_s": bw}, rows)


def part_c(p: Plan, llm: Any, tb_s: float | None) -> Part:
    bw = tb_s or README_COPY_TB_S
    t = step_timing(llm, p.c_rows, p.c_context, p.iters, p.warmup)
    step_tok_s = p.c_rows / t["step_ms"] * 1e3
    bound = p.c_rows / (t["bytes_per_step"] / bw / 1e9) * 1e3
    gen = torch.Generator().manual_seed(13)
    prompts = [random_ids(p.c_context - p.c_new // 2, p.big_arch.vocab_size, gen) for _ in range(p.c_rows)]
    e = engine_decode_rate(llm, prompts, p.c_new)
    engine_tok_s = e["tok_s"] or 0.0
    ref, tgt, name = f"{bound:.0f} tok/s", f">= {C_TARGET_TOK_S:.0f}", f"(c) b={p.c_rows}"
    engine_ok = engine_tok_s >= C_TARGET_TOK_S and not e["errors"]
    rows = [
        row(f"{name} step", f"{step_tok_s:.0f} tok/s", "", ref, "INFO", f"ctx {p.c_context}; {STEP_NOTE}"),
        row(
            f"{name} engine", f"{engine_tok_s:.0f} tok/s", tgt, ref, verdict(engine_ok, p.judged), "generate"
        ),
    ]
    if t["replay_ms"] is not None:
        replay_tok_s = p.c_rows / t["replay_ms"] * 1e3
        rows.append(
            row(f"{name} replay", f"{replay_tok_s:.0f} tok/s", "", ref, note="graph only, no lm_head")
        )
    return Part({"step": t, "engine": e, "bound_tok_s": bound, "copy_tb_s": bw}, rows)


def part_d(
    p: Plan, llm: Any, module: str, apis: Sequence[str] | None = None, gate: str | None = None
) -> Part:
    """`apis`: the endpoints after chat (default p.d_apis). `gate`: a variant on the same engine,
    chat only at its two highest levels, with the event loop's engine gate (stream.engine_first,
    core/engine/handoff/gil_gate.py) off, or on with that probe (device, clock, none): what giving way to
    the engine's host work buys; `last`: gate off, and each routing pass's writes held until its
    end, the order before de082c1 (stream.write_order after_release), against `off`.
    `depth2`: gate off, two steps in flight (engine.overlap_depth 2: step N+2 launched before N
    lands); `depth2-none`: the same with the gate on (probe none). Swapped between steps: the
    engine is idle between parts."""
    from rillet.core.engine.handoff.gil_gate import EngineGate
    from rillet.http.background import BackgroundServer

    engine = llm.engine
    depth, probe = d_variant(gate) if gate is not None else (None, None)
    if probe is not None and not engine.async_launch:  # as resolve_gate refuses it
        return Part({"gate": gate}, [row(f"(d) gate {gate}", verdict="SKIP", note="launches run the model")])
    if depth is not None and not engine.overlap:
        return Part({"gate": gate}, [row(f"(d) gate {gate}", verdict="SKIP", note="engine.overlap is off")])
    kept, kept_depth = engine.gate, engine.core.depth
    engine.core.depth = depth or kept_depth
    chat_levels, apis = p.d_concurrency, p.d_apis if apis is None else tuple(apis)
    if gate is not None:
        engine.core.gate = None if probe is None else EngineGate(probe_mode=probe)
        chat_levels, apis = p.d_concurrency[-2:], ()
    server = BackgroundServer(engine.cfg).start(engine)
    if gate == "last" and server.state.dispatcher is not None:  # read as each stream registers
        server.state.dispatcher.write_last = True
    levels: list[dict[str, Any]] = []
    try:
        levels += _client(p, module, server.base_url, llm.engine.model_name, "chat", chat_levels)
        for api in apis:
            levels += _client(p, module, server.base_url, llm.engine.model_name, api, p.d_api_concurrency)
    finally:
        server.stop()
        if engine.gate is not None:
            engine.gate.open()
        engine.core.gate, engine.core.depth = kept, kept_depth
    rows = []
    for lv in levels:
        tok = lv["tokens"]
        complete = lv["errors"] == 0 and tok["stream"] == tok["nonstream"] == tok["expected_each"]
        ok = complete and (lv["ratio"] or 0) >= D_TARGET_RATIO
        note = f"{lv['stream_tok_s']:.0f} vs {lv['nonstream_tok_s']:.0f} tok/s; {lv['max_tokens']} tok/req"
        for key, what, unit in (
            ("host_ms_per_step", "engine host", "ms/step"),
            ("wall_ms_per_step", "step", "ms"),
            ("device_busy_ms_per_step", "device", "ms"),
            ("device_prep_ms_per_step", "prep", "ms"),
            ("device_idle_ms_per_step", "idle", "ms"),
            ("late_launch_share", "late", "of steps"),
            ("loop_us_per_token", "loop", "us/tok"),
        ):
            got = lv.get(key, {})
            if got.get("stream") is not None and got.get("nonstream") is not None:
                note += f"; {what} {got['stream']:.2f} vs {got['nonstream']:.2f} {unit}"
        if not complete:
            note += f"; tokens {tok}, errors {lv['errors']}"
        api = lv.get("api", "chat")
        variant = "" if gate is None else f"gate {gate} "
        rows.append(
            row(
                f"(d) {variant}{'' if api == 'chat' else api + ' '}c={lv['concurrency']} ratio",
                f"{lv['ratio'] or 0:.3f}",
                f">= {D_TARGET_RATIO}",
                "",
                verdict(ok, p.judged or not complete),
                note,
            )
        )
    configured = "off" if kept is None else kept.probe_mode
    return Part({"levels": levels, "model": engine.model_name, "gate": gate or configured}, rows)


def _client(
    p: Plan, module: str, url: str, model: str, api: str, levels: Sequence[int]
) -> list[dict[str, Any]]:
    """bench/gpu/check.py's HTTP client as a subprocess (it never shares the server's GIL)."""
    cmd = [sys.executable, "-m", module, "--client", url, "--model", model, "--runs", str(p.d_runs)]
    cmd += ["--max-tokens", str(p.d_max_tokens), "--api", api, "--concurrency", *map(str, levels)]
    timeout = max(30.0, p.budget_s / 4)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{api} client exited {proc.returncode}: {proc.stderr[-1500:]}")
    result: list[dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
