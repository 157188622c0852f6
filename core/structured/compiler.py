"""Grammar specs -> compiled llguidance grammars, cached; new matchers are copies of a cached one.

Why llguidance (bench/grammar_engines.py, bench/RESULTS.md): no dependencies and 7.5 MiB
installed (xgrammar pulls triton and imports transformers), grammar compiles in about a
millisecond, and the work of a compile is bounded by fuel limits (`LLParserLimits`) instead of
running for as long as a hostile schema makes it. Matcher construction drops the GIL.

Thread-safety: `compile` runs on worker threads (the HTTP layer's executor), `matcher` on the event
loop; both take the lock only around the cache. A cached template matcher never consumes a token;
requests get `deep_copy()`s of it (microseconds).
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections import OrderedDict
from typing import Any

from rillet.core.structured import json_style
from rillet.core.structured.matcher import GrammarMatcher
from rillet.core.structured.schema import close_objects
from rillet.core.structured.spec import INSTALL_HINT, GrammarError, GrammarSpec, GrammarUnavailable

ANY_OBJECT = '{"type": "object"}'


def grammar_engine_available() -> bool:
    return importlib.util.find_spec("llguidance") is not None


class GrammarCompiler:
    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        cache_size: int,
        json_options: dict[str, str | bool] | None = None,
    ) -> None:
        """`tokenizer_json`: the HF `tokenizers` serialization; `vocab_size`: the logits' width;
        `json_options`: the JSON layout (json_style.py; default flexible). Fixed for the compiler's
        life: its cache is keyed by spec alone."""
        if not grammar_engine_available():
            raise GrammarUnavailable("response_format", INSTALL_HINT)
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.cache_size = cache_size
        self.json_options = (
            dict(json_options) if json_options is not None else json_style.json_options("flexible")
        )
        self._cache: OrderedDict[GrammarSpec, Any] = OrderedDict()  # spec -> template LLMatcher
        self._lock = threading.Lock()
        self._lltok: Any = None
        self._tok_lock = threading.Lock()
        self.compiles = 0  # cache misses, for tests and metrics

    def tokenizer(self) -> Any:
        """The llguidance tokenizer, built on first use (~0.3 s for a 49k vocabulary)."""
        with self._tok_lock:
            if self._lltok is None:
                import llguidance

                # JSON slices: token-trie partitions tuned for JSON strings; mask fills measured about
                # twice as fast as the general ones on JSON schemas (bench/grammar_engines.py)
                self._lltok = llguidance.LLTokenizer(
                    self._tokenizer_json,
                    n_vocab=self.vocab_size,
                    eos_token=list(self.eos_token_ids),
                    slices=llguidance.LLTokenizer.json_slices(),
                )
            return self._lltok

    def compile(self, spec: GrammarSpec) -> Any:
        """The template matcher of `spec`; raises GrammarError naming `spec.param`."""
        with self._lock:
            found = self._cache.get(spec)
            if found is not None:
                self._cache.move_to_end(spec)
                return found
        template = self._build(spec)
        with self._lock:
            self._cache[spec] = template
            self._cache.move_to_end(spec)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            self.compiles += 1
        return template

    def matcher(self, spec: GrammarSpec) -> GrammarMatcher:
        return GrammarMatcher(self.compile(spec).deep_copy())

    @property
    def cached(self) -> int:
        return len(self._cache)

    def _build(self, spec: GrammarSpec) -> Any:
        import llguidance

        grammar = self._grammar_text(spec)
        tok = self.tokenizer()
        message = llguidance.LLMatcher.validate_grammar(grammar, tok)
        if message:
            raise GrammarError(spec.param, f"cannot be compiled: {_first_line(message)}")
        template = llguidance.LLMatcher(tok, grammar, log_level=0)
        if template.is_error():
            raise GrammarError(spec.param, f"cannot be compiled: {_first_line(template.get_error())}")
        return template

    def _grammar_text(self, spec: GrammarSpec) -> str:
        import llguidance

        if spec.kind == "lark":
            return str(llguidance.LLMatcher.grammar_from_lark(spec.source))
        if spec.kind == "regex":
            return str(llguidance.LLMatcher.grammar_from_regex(spec.source))
        source = ANY_OBJECT if spec.kind == "json_object" else _closed(spec)
        options = dict(self.json_options, lenient=False)  # a keyword it cannot enforce is an error
        try:
            return str(llguidance.LLMatcher.grammar_from_json_schema(source, overrides=options))  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            raise GrammarError(spec.param, f"is not a valid JSON Schema: {exc}") from exc


def _closed(spec: GrammarSpec) -> str:
    try:
        schema = json.loads(spec.source)
    except ValueError as exc:
        raise GrammarError(spec.param, f"is not valid JSON: {exc}") from exc
    return json.dumps(close_objects(schema), ensure_ascii=False)


def _first_line(message: str) -> str:
    """llguidance's message on one line (regex errors span several), bounded."""
    text = " ".join(part.strip() for part in message.strip().splitlines() if part.strip())
    return (text or "unknown error")[:500]
