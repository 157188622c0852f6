"""Prefix caching on this machine: TTFT of a request whose first 1,000 tokens were seen before vs a
cold request of the same length, and a multi-turn chat workload with caching on vs off.

    .venv/bin/python -m bench.serving.prefix_cache [--prefix 1000] [--conversations 4] [--turns 4]
    .venv/bin/python -m bench.serving.prefix_cache --short-prefill 0 32 --turns 0   # TTFT only

TTFT here is the offline time from submission to the first sampled token (max_tokens=1): prefill
plus one step, with no HTTP in between, once the compiled steps are in use. A warm request's
uncached tail (~15 tokens) is a short prefill step: `--short-prefill` measures TTFT at each given
`graphs.short_prefill` (0: the tail prefilled eager). Prints a table last, writes JSON.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams

from bench.lib.common import decode_path, peak_rss_mib, table, words, write_json


def ttft(llm: LLM, ids: list[int]) -> float:
    t0 = time.perf_counter()
    llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))
    return time.perf_counter() - t0


def bench_ttft(prefix_len: int, repeats: int, short_prefill: int | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {"cache": {"num_blocks": 1024}, "scheduler": {"max_num_batched_tokens": 4096}}
    if short_prefill is not None:
        raw["graphs"] = {"short_prefill": short_prefill}
    cfg = config_from_dict(raw)
    rng = random.Random(0)
    cold, warm = [], []
    with LLM(cfg) as llm:
        path = decode_path(llm)
        tok = llm.tokenizer
        ttft(llm, tok.encode(words(rng, 50)))  # warm-up
        for _ in range(repeats):
            prefix = tok.encode(words(rng, prefix_len * 2))[:prefix_len]
            cold.append(ttft(llm, prefix + tok.encode(" question one: " + words(rng, 8))))
            warm.append(ttft(llm, prefix + tok.encode(" question two: " + words(rng, 8))))
    c, w = statistics.median(cold), statistics.median(warm)
    return {
        "short_prefill": cfg.graphs.short_prefill,
        "decode_path": path,
        "prefix_tokens": prefix_len,
        "cold_ttft_ms": c * 1000,
        "warm_ttft_ms": w * 1000,
        "speedup": c / w,
    }


def bench_chat(caching: bool, conversations: int, turns: int, max_tokens: int) -> dict[str, Any]:
    cfg = config_from_dict({"cache": {"num_blocks": 2048, "prefix_caching": caching}})
    rng = random.Random(1)
    with LLM(cfg) as llm:
        tok = llm.tokenizer
        histories = [[{"role": "user", "content": words(rng, 40)}] for _ in range(conversations)]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        prompt_tokens = gen_tokens = 0
        t0 = time.perf_counter()
        for _ in range(turns):
            prompts = [tok.encode(tok.apply_chat_template(h), add_special_tokens=False) for h in histories]
            outs = llm.generate(prompts, params)
            for h, o, p in zip(histories, outs, prompts, strict=True):
                h.append({"role": "assistant", "content": o.outputs[0].text})
                h.append({"role": "user", "content": words(rng, 20)})
                prompt_tokens += len(p)
                gen_tokens += len(o.outputs[0].token_ids)
        wall = time.perf_counter() - t0
        hit = llm.engine.stats().cached_prompt_tokens
    return {
        "prefix_caching": caching,
        "wall_s": wall,
        "requests_per_s": conversations * turns / wall,
        "gen_tok_s": gen_tokens / wall,
        "prompt_tokens": prompt_tokens,
        "cached_prompt_tokens": hit,
        "hit_rate": hit / prompt_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4, help="chat turns (0: no chat workload)")
    ap.add_argument("--short-prefill", type=int, nargs="*", default=None, help="graphs.short_prefill values")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", default="bench/out/prefix_cache.json")
    a = ap.parse_args()
    ts = [bench_ttft(a.prefix, a.repeats, v) for v in (a.short_prefill or [None])]
    chats = [bench_chat(c, a.conversations, a.turns, a.max_tokens) for c in (False, True)] if a.turns else []
    rss = peak_rss_mib()
    write_json(a.out, {"ttft": ts, "chat": chats, "peak_rss_mib": rss})
    print(f"peak RSS {rss:.0f} MiB")
    cols = ["short_prefill", "decode_path", "prefix_tokens", "cold_ttft_ms", "warm_ttft_ms", "speedup"]
    print(table(ts, cols))
    if chats:
        print()
        print(table(chats, ["prefix_caching", "wall_s", "requests_per_s", "gen_tok_s", "hit_rate"]))


if __name__ == "__main__":
    main()
