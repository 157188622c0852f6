"""Which grammar engine: llguidance vs xgrammar on this machine, with the default model's vocabulary.

For each engine that is importable: the time to compile a set of JSON schemas, then a simulated
constrained decode at batch 1 / 16 / 64 — every row holds its own matcher, the rows sit at staggered
positions of a valid JSON document (tokenized by the model's tokenizer), and each step fills the
bitmask of every row (the engine's batched fill) and then advances every matcher by one token.
Reports the per-step fill and advance times (median over the steps) and the installed size of
the engine's package. No model runs: this is the grammar work alone.

xgrammar is not a rillet dependency (it pulls triton and transformers); to measure it, install it
(and apache-tvm-ffi) somewhere with --no-deps and put that folder on PYTHONPATH.

    .venv/bin/python bench/grammar_engines.py [--steps 60]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rillet.core.loaders.default_model import default_model_path
from rillet.core.tokenizer.tokenizer import Tokenizer

from bench.lib.common import peak_rss_mib, table, write_json

SEPARATORS = (", ", ": ")
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "zip"],
        },
    },
    "required": ["name", "age", "email", "role", "tags", "address"],
}
DOC = {
    "name": "Ada Lovelace, the first programmer",
    "age": 36,
    "email": "ada@example.com",
    "role": "editor",
    "tags": ["math", "poetry", "engines", "notes"],
    "address": {"street": "12 St James's Square, London", "zip": "12345"},
}
COMPILE_SCHEMAS = [
    SCHEMA,
    {"type": "object"},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 8},
    {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
            }
        },
        "$ref": "#/$defs/node",
    },
    {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "when": {"type": "string", "format": "date-time"},
        },
    },
]


class Engine:
    name: str
    package: str

    def compile(self, schema: dict[str, Any]) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def fill(self, matchers: list[Any], mask: Any) -> None: ...
    def advance(self, matchers: list[Any], tokens: list[int]) -> None: ...
    def new_mask(self, batch: int) -> Any: ...


class LLGuidance(Engine):
    name, package = "llguidance", "llguidance"

    def __init__(self, tok: Tokenizer, vocab: int) -> None:
        import llguidance as llg

        self.llg = llg
        self.vocab = vocab
        # as rillet builds it (core/structured/compiler.py): JSON slices
        self.tok = llg.LLTokenizer(
            tok.backend_json(),
            n_vocab=vocab,
            eos_token=list(tok.eos_token_ids),
            slices=llg.LLTokenizer.json_slices(),
        )
        self.executor = llg.LLExecutor()
        sep = {"item_separator": SEPARATORS[0], "key_separator": SEPARATORS[1], "whitespace_flexible": False}
        self.options = sep

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, overrides=self.options)
        m = self.llg.LLMatcher(self.tok, grammar)  # construction compiles (lexer, token trie walk)
        assert not m.is_error(), m.get_error()
        return grammar

    def matcher(self, compiled: Any) -> Any:
        return self.llg.LLMatcher(self.tok, compiled)

    def new_mask(self, batch: int) -> Any:
        return np.full((batch, (self.vocab + 31) // 32), -1, dtype=np.int32)

    def fill(self, matchers: list[Any], mask: Any) -> None:
        self.executor.unsafe_compute_mask_ptr(
            [(m, i) for i, m in enumerate(matchers)], mask.ctypes.data, mask.shape[1] * 4, mask.shape[0]
        )

    def advance(self, matchers: list[Any], tokens: list[int]) -> None:
        for m, t in zip(matchers, tokens, strict=True):
            assert m.consume_token(t), m.get_error()


class XGrammar(Engine):
    name, package = "xgrammar", "xgrammar"

    def __init__(self, tok: Tokenizer, vocab: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.vocab = vocab
        vocab_bytes = [tok.token_bytes(i) or b"" for i in range(vocab)]
        special = [i for i in range(vocab) if i in tok.special_token_ids]
        for i in special:  # special tokens must never match text
            vocab_bytes[i] = tok.id_to_token(i).encode()
        self.info = xgr.TokenizerInfo(
            vocab_bytes, xgr.VocabType.RAW, vocab_size=vocab, stop_token_ids=list(tok.eos_token_ids)
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=False)
        self.batch = xgr.BatchGrammarMatcher(max_threads=2)

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=SEPARATORS
        )

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def new_mask(self, batch: int) -> Any:
        return self.xgr.allocate_token_bitmask(batch, self.vocab)

    def fill(self, matchers: list[Any], mask: Any) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, mask)

    def advance(self, matchers: list[Any], tokens: list[int]) -> None:
        for m, t in zip(matchers, tokens, strict=True):
            assert m.accept_token(t)


def installed_mib(package: str) -> float:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2**20


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def run_engine(engine: Engine, tokens: list[int], steps: int, batches: list[int]) -> list[dict[str, Any]]:
    compile_ms = [timed(lambda s=s: engine.compile(s)) for s in COMPILE_SCHEMAS]
    compiled = engine.compile(SCHEMA)
    rows = []
    for batch in batches:
        matchers = [engine.matcher(compiled) for _ in range(batch)]
        # stagger: row i starts i tokens into the document, so rows sit in different grammar states
        starts = [i % max(1, len(tokens) - steps) for i in range(batch)]
        for m, s in zip(matchers, starts, strict=True):
            for t in tokens[:s]:
                engine.advance([m], [t])
        mask = engine.new_mask(batch)
        fill, adv = [], []
        for k in range(steps):
            fill.append(timed(lambda ms=matchers, bm=mask: engine.fill(ms, bm)))
            nxt = [tokens[s + k] for s in starts]
            adv.append(timed(lambda ms=matchers, nxt=nxt: engine.advance(ms, nxt)))
        rows.append(
            {
                "engine": engine.name,
                "batch": batch,
                "fill_ms_p50": statistics.median(fill),
                "fill_ms_max": max(fill),
                "advance_ms_p50": statistics.median(adv),
                "compile_ms_max": max(compile_ms),
                "install_mib": installed_mib(engine.package),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--out", default="bench/results/grammar_engines.json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    tok = Tokenizer.from_gguf(default_model_path())
    vocab = tok.vocab_size
    text = json.dumps(DOC, separators=(", ", ": "))
    tokens = tok.encode(text, add_special_tokens=False)
    assert len(tokens) > args.steps + 1, f"document has {len(tokens)} tokens; fewer steps please"
    engines: list[Engine] = []
    for cls in (LLGuidance, XGrammar):
        if importlib.util.find_spec(cls.package) is None:
            print(f"{cls.package}: not installed, skipped")
            continue
        engines.append(cls(tok, vocab))
    rows: list[dict[str, Any]] = []
    for e in engines:
        rows += run_engine(e, tokens, args.steps, args.batch)
    for r in rows:
        r["peak_rss_mib"] = peak_rss_mib()
    write_json(args.out, {"doc_tokens": len(tokens), "steps": args.steps, "rows": rows})
    cols = [
        "engine",
        "batch",
        "fill_ms_p50",
        "fill_ms_max",
        "advance_ms_p50",
        "compile_ms_max",
        "install_mib",
        "peak_rss_mib",
    ]
    print(table(rows, cols))


if __name__ == "__main__":
    main()
