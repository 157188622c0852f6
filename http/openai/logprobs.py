"""Token logprobs in OpenAI's two shapes (chat `content` entries, legacy completions columns)."""

from __future__ import annotations

from typing import Any

from rillet.core.sequence import TokenLogprob

# OpenAI reports -inf as this; JSON has no infinity.
_FLOOR = -9999.0


class TokenTexts:
    """token id -> (display text, its UTF-8 bytes), computed once per id (bounded by the vocabulary).

    A token that is only part of a UTF-8 character gets OpenAI's `bytes:\\xe2\\x80` text form.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._compute(token_id)
        return hit

    def text(self, token_id: int) -> str:
        return self.get(token_id)[0]

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        raw = self._tokenizer.token_bytes(token_id)
        if raw is None:  # a special token: no bytes of its own, show its name
            name = str(self._tokenizer.id_to_token(token_id))
            return name, list(name.encode())
        try:
            return raw.decode("utf-8"), list(raw)
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)


def _lp(x: float) -> float:
    return x if x > _FLOOR else _FLOOR


def chat_entries(lps: list[TokenLogprob], texts: TokenTexts) -> list[dict[str, Any]]:
    """Entries of a chat choice's `logprobs.content`."""
    out = []
    for lp in lps:
        text, raw = texts.get(lp.token_id)
        top = []
        for tid, value in lp.top:
            t_text, t_raw = texts.get(tid)
            top.append({"token": t_text, "logprob": _lp(value), "bytes": t_raw})
        out.append({"token": text, "logprob": _lp(lp.logprob), "bytes": raw, "top_logprobs": top})
    return out


class CompletionLogprobs:
    """The columns of a completions choice's `logprobs`; `text_offset` runs on across chunks."""

    __slots__ = ("offset",)

    def __init__(self, start_offset: int = 0) -> None:
        self.offset = start_offset

    def columns(self, lps: list[TokenLogprob], texts: TokenTexts) -> dict[str, Any]:
        tokens, token_lps, tops, offsets = [], [], [], []
        for lp in lps:
            text = texts.text(lp.token_id)
            tokens.append(text)
            token_lps.append(_lp(lp.logprob))
            tops.append({texts.text(tid): _lp(value) for tid, value in lp.top})
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    def prompt_columns(
        self, prompt: list[int], scored: list[TokenLogprob], texts: TokenTexts
    ) -> dict[str, Any]:
        """An echoed prompt's columns (completions with echo and logprobs): its first token has no
        logprob (null, as OpenAI reports it: nothing comes before it), the others `scored`."""
        if not prompt:
            return merge_columns([])
        text = texts.text(prompt[0])
        first = {"tokens": [text], "token_logprobs": [None], "top_logprobs": [None]}
        first["text_offset"] = [self.offset]
        self.offset += len(text)
        return merge_columns([first, self.columns(scored, texts)])


def merge_columns(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for part in parts:
        for key, values in merged.items():
            values.extend(part[key])
    return merged
