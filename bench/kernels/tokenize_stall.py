"""How long tokenizing a prompt stops the server's other Python threads.

A "step" thread stands in for the engine thread's host work (and the event loop's writes): Python
work in slices of ~0.1 ms, each timed. Meanwhile the main thread tokenizes a prompt of N tokens
(the default model's tokenizer) the way `tokenizers` does alone (`encode`: the GIL held for the
whole call) and the way rillet does (`Tokenizer.encode`: past GIL_FREE_CHARS, `encode_batch`,
which releases it). Reported: the encode's own time alone, and the step thread's longest gap
between two slices while the prompt is tokenized (a stall every stream on the server would see).

    .venv/bin/python -m bench.kernels.tokenize_stall
    .venv/bin/python -m bench.kernels.tokenize_stall --tokens 500 4000 16000 --repeats 10

Prints a table last and writes JSON (with the process's peak RSS).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from rillet.core.loaders.default_model import default_model_path
from rillet.core.tokenizer.tokenizer import GIL_FREE_CHARS, Tokenizer

from bench.lib.common import peak_rss_mib, table, write_json

SENTENCE = "The keeper of the lighthouse wrote down, each night, what the sea had brought ashore. "


class StepThread:
    """Python work in short slices; records the longest gap between two slices' ends."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            x = 0
            for i in range(300):  # ~0.01-0.02 ms of bytecode
                x += i
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self) -> StepThread:
        self._thread.start()
        time.sleep(0.02)
        self.longest = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def prompt_of(tok: Tokenizer, tokens: int) -> str:
    per = len(tok.encode(SENTENCE, add_special_tokens=False))
    return SENTENCE * max(1, tokens // per)


def measure(encode: Callable[[], object], repeats: int) -> dict[str, float]:
    alone = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        encode()
        alone.append(time.perf_counter() - t0)
    stalls = []
    for _ in range(repeats):
        with StepThread() as step:
            encode()
        stalls.append(step.longest)  # after the join: the slice the stall delayed has ended
    return {"encode_ms": 1e3 * statistics.median(alone), "stall_ms": 1e3 * statistics.median(stalls)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[300, 1000, 4000, 16000])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="bench/out/tokenize_stall.json")
    a = ap.parse_args()
    tok = Tokenizer.from_gguf(default_model_path())
    backend = tok._backend
    rows: list[dict[str, Any]] = []
    for n in a.tokens:
        text = prompt_of(tok, n)
        ntok = len(tok.encode(text, add_special_tokens=False))
        plain = measure(partial(backend.encode, text, add_special_tokens=False), a.repeats)
        ours = measure(partial(tok.encode, text, add_special_tokens=False), a.repeats)
        rows.append(
            {
                "tokens": ntok,
                "chars": len(text),
                "gil_free": len(text) >= GIL_FREE_CHARS,
                "encode_ms": round(plain["encode_ms"], 3),
                "rillet_encode_ms": round(ours["encode_ms"], 3),
                "stall_ms": round(plain["stall_ms"], 3),
                "rillet_stall_ms": round(ours["stall_ms"], 3),
            }
        )
    rss = peak_rss_mib()
    write_json(
        a.out, {"repeats": a.repeats, "gil_free_chars": GIL_FREE_CHARS, "peak_rss_mib": rss, "rows": rows}
    )
    print(f"median of {a.repeats}; GIL_FREE_CHARS {GIL_FREE_CHARS}; peak RSS {rss:.0f} MiB")
    cols = ["tokens", "chars", "gil_free", "encode_ms", "rillet_encode_ms", "stall_ms", "rillet_stall_ms"]
    print(table(rows, cols))


if __name__ == "__main__":
    main()
