"""End-to-end checks on the real default model (SmolLM2-135M, fp32 CPU): real tokens, logprobs, seeds."""

from __future__ import annotations

from typing import Any

import openai
import pytest

MESSAGES = [{"role": "user", "content": "Name a colour."}]


def test_greedy_stream_equals_nonstream(client: openai.OpenAI, model: str) -> None:
    full = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content and text.strip()
    assert full.usage is not None and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens <= 8
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens > 20  # the template's system prompt


def test_seed_reproducibility(client: openai.OpenAI, model: str) -> None:
    def sample(seed: int) -> list[str]:
        r = client.completions.create(
            model=model, prompt="My favourite word is", max_tokens=4, temperature=1.5, seed=seed, n=2
        )
        return [c.text for c in r.choices]

    a, b, c = sample(7), sample(7), sample(8)
    assert a == b
    assert a != c
    assert a[0] != a[1]  # choice i samples with seed + i


def test_chat_logprobs_shape(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == r.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        assert isinstance(entry.token, str) and entry.logprob <= 0
        assert entry.bytes is not None and bytes(entry.bytes).decode("utf-8", "replace")
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        # Greedy: the chosen token is the most likely one.
        assert entry.token == entry.top_logprobs[0].token
    joined = b"".join(bytes(e.bytes or []) for e in content).decode("utf-8", "replace")
    assert joined == r.choices[0].message.content
    streamed = [
        c.choices[0].logprobs
        for c in client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=5,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=True,
        )
        if c.choices and c.choices[0].logprobs is not None
    ]
    assert [e.token for lp in streamed for e in lp.content or []] == [e.token for e in content]


def test_completion_logprobs_shape(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt="The sky is", max_tokens=4, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(1 <= len(top) <= 3 and tok in top for tok, top in zip(lp.tokens, lp.top_logprobs, strict=True))


def test_echo_with_logprobs_scores_the_prompt(client: openai.OpenAI, model: str, server: Any) -> None:
    """lm-evaluation-harness's loglikelihood request (prompts as ids, echo, logprobs=1, max_tokens=1):
    the echoed prompt's tokens carry the logprobs the model gives them, as it gave them when it
    generated those same tokens (prefill and decode score each position alike)."""
    tok = server.state.engine.tokenizer
    context = tok.encode("The capital of France is")
    gen = client.completions.create(model=model, prompt=context, max_tokens=3, temperature=0, logprobs=1)
    glp = gen.choices[0].logprobs
    assert glp is not None and glp.tokens is not None and glp.token_logprobs is not None
    full = tok.encode(tok.decode(context) + gen.choices[0].text)
    r = client.completions.create(
        model=model, prompt=[full, context], max_tokens=1, temperature=0, logprobs=1, echo=True
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(full) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing comes before it
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset == sorted(lp.text_offset)
    n = len(context)
    assert lp.tokens[n : n + 3] == glp.tokens
    assert lp.token_logprobs[n : n + 3] == pytest.approx(glp.token_logprobs, abs=1e-3)
    # greedy tokens are their position's top choice (the harness's is_greedy)
    picked = zip(lp.token_logprobs[n : n + 3], lp.top_logprobs[n : n + 3], strict=True)
    assert all(t == max(top.values()) for t, top in picked)
    short = r.choices[1].logprobs
    assert short is not None and short.token_logprobs is not None
    assert short.token_logprobs[1:n] == pytest.approx(lp.token_logprobs[1:n], abs=1e-3)  # same prefix
