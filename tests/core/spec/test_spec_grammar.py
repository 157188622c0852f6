"""A verify step's grammar masks (core/spec/grammar.py): each position is masked by the grammar state
after the drafts before it, and the matcher is left where the sequence's kept outputs put it, also
when a draft runs past the grammar's end (EOS drafted after the last token it allows)."""

from __future__ import annotations

import pytest
from rillet.core.loaders.default_model import default_model_path
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq
from rillet.core.spec.grammar import verify_masks
from rillet.core.structured.compiler import GrammarCompiler
from rillet.core.structured.masks import MaskFiller
from rillet.core.structured.spec import GrammarSpec
from rillet.core.tokenizer.tokenizer import Tokenizer

pytest.importorskip("llguidance")

VOCAB = 49152


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(default_model_path())


def _id(tok: Tokenizer, text: str) -> int:
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == 1, text
    return ids[0]


def test_a_draft_past_the_grammars_end_leaves_the_matcher_where_it_was(tok: Tokenizer) -> None:
    compiler = GrammarCompiler(tok.backend_json(), VOCAB, tok.eos_token_ids, 4)
    a, b, eos = _id(tok, "a"), _id(tok, "b"), tok.eos_token_ids[0]
    s = Seq(0, "r0", [a], SamplingParams(max_tokens=8))
    s.grammar = compiler.matcher(GrammarSpec("regex", "ab"))
    s.output_ids = [a]
    s.grammar.sync(s.output_ids)
    # "b" ends the grammar (the matcher stops); the drafted EOS after it is what llguidance takes
    # without counting it as a token to roll back
    s.draft_ids = [b, eos]
    mask = verify_masks(MaskFiller(VOCAB, tok.eos_token_ids), [s, s, s], [0, 1, 2])
    assert mask is not None and mask.rows == [0, 1, 2]
    m = s.grammar.matcher
    assert not m.is_stopped() and not m.is_error()
    assert m.validate_tokens([b]) == 1  # still after "a": "b" next, not "a" again
    s.grammar.accept(b)  # the engine lands the kept run
    assert m.is_stopped() and not m.is_error()
