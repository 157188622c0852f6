"""structured.whitespace: JSON the way models write it (newlines, indentation), with a bound that
makes a whitespace flood impossible, checked on the default model's real tokenizer: per gap, and
token by token (a single vocabulary token may hold 80 spaces)."""

from __future__ import annotations

import json

import pytest
from rillet.core.loaders.default_model import default_model_path
from rillet.core.structured import json_style
from rillet.core.structured.compiler import GrammarCompiler
from rillet.core.structured.spec import GrammarSpec
from rillet.core.tokenizer.tokenizer import Tokenizer

pytest.importorskip("llguidance")

PRETTY = '{\n    "fruit1": {\n        "name": "Apple",\n        "color": "red"\n    },\n    "n": [1, 2]\n}'
COMPACT = '{"fruit1": {"name": "Apple", "color": "red"}, "n": [1, 2]}'
FLOODS = {
    "30 newlines": "{" + "\n" * 30 + '"a": 1}',
    "200 spaces": '{"a":' + " " * 200 + "1}",
    "one 81-byte token": "{\n" + " " * 80 + '"a": 1}',
    "a blank line": '{\n\n"a": 1}',
}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(default_model_path())


def _compiler(tok: Tokenizer, mode: json_style.WhitespaceMode) -> GrammarCompiler:
    return GrammarCompiler(tok.backend_json(), 49152, tok.eos_token_ids, 4, json_style.json_options(mode))


def _accepts(compiler: GrammarCompiler, tok: Tokenizer, text: str, kind: str = "json_object") -> bool:
    m = compiler.matcher(GrammarSpec(kind, "" if kind == "json_object" else json.dumps({"type": "object"})))
    ids = tok.encode(text, add_special_tokens=False)
    return (
        m.matcher.validate_tokens(ids) == len(ids)
        and m.matcher.consume_tokens(ids)
        and m.matcher.is_accepting()
    )


def test_flexible_takes_pretty_and_compact_json_and_refuses_floods(tok: Tokenizer) -> None:
    flexible = _compiler(tok, "flexible")
    assert _accepts(flexible, tok, PRETTY) and _accepts(flexible, tok, COMPACT)
    assert _accepts(flexible, tok, PRETTY.replace("\n", "\r\n"), "json_schema")
    assert {name: _accepts(flexible, tok, text) for name, text in FLOODS.items()} == dict.fromkeys(
        FLOODS, False
    )


def test_compact_is_one_line(tok: Tokenizer) -> None:
    compact = _compiler(tok, "compact")
    assert _accepts(compact, tok, COMPACT) and not _accepts(compact, tok, PRETTY)


def test_no_allowed_token_overflows_a_gap(tok: Tokenizer) -> None:
    """At gaps of every kind, with spaces already written (after a line break or not), no token the
    mask allows may carry the gap's whitespace past the bound: the cap holds token by token."""
    import numpy as np

    m = _compiler(tok, "flexible").matcher(GrammarSpec("json_object"))
    table = tok.token_bytes_table()
    leading = [len(b) - len(b.lstrip(b" \t\r\n")) for b in table]
    space = tok.encode(" ", add_special_tokens=False)
    assert len(space) == 1
    for prefix in ("{", '{"a":', '{"a": 1,', '{"a": [1', '{"a": {"b": 2}', '{"a": 1,\n'):
        g = m.matcher.deep_copy()
        assert g.consume_tokens(tok.encode(prefix, add_special_tokens=False))
        written = len(prefix) - len(prefix.rstrip(" \n"))
        while True:
            allowed = np.frombuffer(g.compute_logit_bias(), np.uint8)[: len(table)] > 0
            worst = max(leading[i] for i in np.flatnonzero(allowed))
            assert written + worst <= json_style.GAP_BYTES, (prefix, written, worst)
            if not allowed[space[0]]:
                break
            assert g.consume_token(space[0])
            written += 1


def test_an_llguidance_too_old_to_bound_falls_back_to_compact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_style, "_installed_version", lambda: (1, 7, 9))
    assert json_style.json_options("flexible") == json_style.COMPACT
    monkeypatch.setattr(json_style, "_installed_version", lambda: (1, 9, 1))
    assert json_style.json_options("flexible") == json_style.FLEXIBLE
