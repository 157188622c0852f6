"""rillet against llama.cpp's `llama-server` on the same GGUF and machine (issue 68): the seed
issue's method, the official `openai` client asking for a greedy chat completion of `--max-tokens`
tokens with ignore_eos (both servers take it), streamed and not, at concurrency 1 and 8.

Both servers stay up (an idle one costs nothing); only one serves a workload at a time. Each
round measures every mode (C, streamed or not) on both servers back to back, `--batches` batches
of C simultaneous requests each, the server that goes first alternating from mode to mode and
round to round (ABBA), so that the drift of a shared VM hits both alike. Tokens come from `usage`
(streams ask for it with stream_options.include_usage). rillet runs its default config (its
`--set` overrides on top) with its compiled steps saved under a persistent `model.cache_dir`
(built once, loaded by later runs) and is measured once the compiled decode step is in use;
llama-server runs `-m GGUF -t 2 -tb 2 -np 8 -c 4096 --jinja`.

    # the AVX2 row: rillet under the AVX2 cap, llama.cpp built AVX2-only (bench/README.md)
    python -m bench.compare.vs_llamacpp --llama-server /tmp/llama/avx2/llama-server --avx2-cap
    # the native row: both at the CPU's own ISA
    python -m bench.compare.vs_llamacpp --llama-server /tmp/llama/native/llama-server

Prints per mode rillet's and llama.cpp's tok/s, their ratio (sums over rounds, and the median
of the rounds' ratios), the min/max over rounds, the CPU the rest of the host took meanwhile;
each server's peak RSS (VmHWM); writes JSON under bench/out/.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from bench.lib.common import add_pinning, pin_client, process_cpu, table, write_json
from bench.lib.llama_server import LlamaServer
from bench.lib.rounds import merge
from bench.lib.sdk_client import PROMPT, make_clients
from bench.lib.server_proc import RilletServer
from bench.lib.timed_batch import client_cpu, run_batch

AVX2_CAP = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
SERVERS = ("rillet", "llama.cpp")
KEY = ("server", "concurrency", "stream")
SUMS = ("tokens", "wall_s", "requests")


def model_name(base_url: str) -> str:
    return openai.OpenAI(base_url=base_url, api_key="unused").models.list().data[0].id


def sample(base_url: str, model: str) -> str:
    """The start of one greedy answer, so a reader of the JSON sees both servers answer alike."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=48, temperature=0.0
    )
    return answer.choices[0].message.content or ""


def warm_up(base_url: str, model: str, concurrency: list[int]) -> None:
    """First-request costs (and each batch size's first step) stay out of the numbers."""
    for c in concurrency:
        clients = make_clients(base_url, "unused", "chat", c)
        for stream in (False, True):
            run_batch(clients, model, stream, 8)


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    pid: int


def host_busy_s() -> float:
    """CPU seconds the host's cores have been busy since boot, every process together (/proc/stat)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def measure(t: Target, c: int, stream: bool, batches: int, max_tokens: int) -> dict[str, Any]:
    """`batches` batches of C requests; beside tok/s, the CPU the rest of the host took meanwhile
    (busy cores minus the measured server's and this client's CPU, in cores): on a shared VM a
    round with others at work is slower for a reason of neither server's."""
    clients = make_clients(t.url, "unused", "chat", c)
    h0, s0, c0 = host_busy_s(), process_cpu(t.pid) or 0.0, client_cpu()
    done = [run_batch(clients, t.model, stream, max_tokens) for _ in range(batches)]
    h1, s1, c1 = host_busy_s(), process_cpu(t.pid) or 0.0, client_cpu()
    tokens, wall = sum(b.tokens for b in done), sum(b.wall_s for b in done)
    others = max(0.0, (h1 - h0) - (s1 - s0) - (c1 - c0)) / wall
    return {
        "tokens": tokens,
        "wall_s": wall,
        "requests": c * batches,
        "tok_s": tokens / wall,
        "others": others,
    }


def run_rounds(targets: dict[str, Target], args: argparse.Namespace) -> list[list[dict[str, Any]]]:
    modes = [(c, stream) for c in args.concurrency for stream in (False, True)]
    rounds: list[list[dict[str, Any]]] = []
    for r in range(args.rounds):
        rows = []
        for m, (c, stream) in enumerate(modes):
            order = SERVERS if (r + m) % 2 == 0 else SERVERS[::-1]
            for name in order:
                got = measure(targets[name], c, stream, args.batches, args.max_tokens)
                rows.append({"round": r, "server": name, "concurrency": c, "stream": stream, **got})
                print(
                    f"round {r} c={c} stream={stream} {name}: {got['tok_s']:.1f} tok/s "
                    f"(others' CPU {got['others']:.2f} cores)",
                    file=sys.stderr,
                )
        rounds.append(rows)
    return rounds


def mode_label(c: int, stream: bool) -> str:
    return f"c={c} {'stream' if stream else 'non-stream'}"


def per_round(
    rounds: list[list[dict[str, Any]]], name: str, c: int, stream: bool, col: str = "tok_s"
) -> list[float]:
    """One server's figure in one mode (tok/s, or others' CPU), one a round."""
    return [
        r[col]
        for rows in rounds
        for r in rows
        if (r["server"], r["concurrency"], r["stream"]) == (name, c, stream)
    ]


def summarize(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per mode: tok/s over all rounds (tokens / wall summed), their ratio, and the
    per-round ratios' and speeds' min/max."""
    merged = {(m["server"], m["concurrency"], m["stream"]): m for m in merge(rounds, KEY, SUMS)}
    out = []
    for c, stream in dict.fromkeys((k[1], k[2]) for k in merged):
        ours, theirs = merged["rillet", c, stream], merged["llama.cpp", c, stream]
        a, b = per_round(rounds, "rillet", c, stream), per_round(rounds, "llama.cpp", c, stream)
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        others = [max(per_round(rounds, n, c, stream, "others")) for n in SERVERS]
        per_request = [m["tokens"] / m["requests"] for m in (ours, theirs)]
        out.append(
            {
                "mode": mode_label(c, stream),
                "concurrency": c,
                "stream": stream,
                "rillet tok/s": ours["tokens"] / ours["wall_s"],
                "llama.cpp tok/s": theirs["tokens"] / theirs["wall_s"],
                "ratio": (ours["tokens"] / ours["wall_s"]) / (theirs["tokens"] / theirs["wall_s"]),
                # a round another process slowed (others' CPU) sways the sums; the median, not
                "median ratio": statistics.median(ratios),
                "ratio min/max": f"{min(ratios):.3f} / {max(ratios):.3f}",
                "rillet min/max": f"{min(a):.1f} / {max(a):.1f}",
                "llama.cpp min/max": f"{min(b):.1f} / {max(b):.1f}",
                "others' CPU max R|L": "{:.2f} | {:.2f}".format(*others),
                "tokens/request R|L": "{:.0f} | {:.0f}".format(*per_request),
                "round_ratios": ratios,
                "rillet_rounds": a,
                "llama_rounds": b,
            }
        )
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True, help="path of llama.cpp's llama-server binary")
    ap.add_argument("--gguf", help="the model file (default: rillet's default model)")
    ap.add_argument("--avx2-cap", action="store_true", help="rillet under the AVX2 cap (ATen, oneDNN, MKL)")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="rillet config override")
    cache = str(Path.home() / ".cache" / "rillet")
    ap.add_argument("--cache-dir", default=cache, help="rillet's model.cache_dir (compiled steps kept)")
    flags = "-t 2 -tb 2 -np 8 -c 4096 --jinja"
    ap.add_argument("--llama-args", default=flags, help="llama-server's flags besides -m")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=2, help="batches of C requests per mode, server and round")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--out", help="JSON path (default: bench/out/vs_llamacpp[_avx2].json)")
    add_pinning(ap)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    cpus = pin_client(args)
    if args.gguf is None:
        from rillet.core.loaders.default_model import default_model_path

        args.gguf = str(default_model_path())
    out = args.out or f"bench/out/vs_llamacpp{'_avx2' if args.avx2_cap else ''}.json"
    sets = [f"model.path={args.gguf}", f"model.cache_dir={args.cache_dir}", *args.sets]
    env = AVX2_CAP if args.avx2_cap else {}
    with contextlib.ExitStack() as stack:
        print("starting rillet serve (and waiting for its compiled step) ...", file=sys.stderr)
        rillet = stack.enter_context(RilletServer(sets, cpus=cpus, env=env))
        print("starting llama-server ...", file=sys.stderr)
        flags = ["-m", args.gguf, *args.llama_args.split()]
        llama = stack.enter_context(LlamaServer(args.llama_server, flags, cpus=cpus))
        assert rillet.proc is not None and llama.proc is not None
        pids = {"rillet": rillet.proc.pid, "llama.cpp": llama.proc.pid}
        urls = {"rillet": rillet.base_url, "llama.cpp": llama.base_url}
        targets = {n: Target(urls[n], model_name(urls[n]), pids[n]) for n in SERVERS}
        samples = {n: sample(t.url, t.model) for n, t in targets.items()}
        for t in targets.values():
            warm_up(t.url, t.model, args.concurrency)
        load = [Path("/proc/loadavg").read_text().split()[0]]  # other work on the host skews both
        rounds = run_rounds(targets, args)
        load.append(Path("/proc/loadavg").read_text().split()[0])
        rss = {"rillet": rillet.peak_rss_mib(), "llama.cpp": llama.peak_rss_mib()}
        decode_path = rillet.decode_path
    rows = summarize(rounds)
    write_json(
        out,
        {
            "gguf": args.gguf,
            "avx2_cap": args.avx2_cap,
            "rillet_sets": sets,
            "rillet_env": env,
            "rillet_decode_path": decode_path,
            "llama_server": args.llama_server,
            "llama_args": args.llama_args,
            "cpu_flags_avx512": "avx512f" in Path("/proc/cpuinfo").read_text(),
            "max_tokens": args.max_tokens,
            "batches": args.batches,
            "rounds_count": args.rounds,
            "peak_rss_mib": rss,
            "loadavg_1min_before_after": load,
            "samples": samples,
            "summary": rows,
            "rounds": rounds,
        },
    )
    cap = "rillet under the AVX2 cap" if args.avx2_cap else "native ISA"
    print(
        f"{cap}; llama-server {args.llama_server}; {args.max_tokens} tokens a request, greedy, ignore_eos; "
        f"{args.rounds} rounds x {args.batches} batches per mode; rillet decode step: {decode_path}; "
        f"JSON: {out}"
    )
    print(f"load average (1 min) before / after the rounds: {load[0]} / {load[1]}")
    print("peak RSS MiB: " + ", ".join(f"{k} {v:.0f}" if v is not None else f"{k} -" for k, v in rss.items()))
    cols = [
        "mode",
        "rillet tok/s",
        "llama.cpp tok/s",
        "ratio",
        "median ratio",
        "ratio min/max",
        "rillet min/max",
    ]
    cols += ["llama.cpp min/max", "others' CPU max R|L", "tokens/request R|L"]
    print(table(rows, cols))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
