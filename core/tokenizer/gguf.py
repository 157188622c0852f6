"""A `tokenizers.Tokenizer` rebuilt from a GGUF file's `tokenizer.ggml.*` metadata.

Mirrors what transformers builds for the same file (`AutoTokenizer.from_pretrained(dir,
gguf_file=...)`), so token ids match it exactly:
  - `gpt2` (byte-level BPE: SmolLM2, Llama 3, Qwen2): vocabulary and merges as stored, the split
    regex named by `tokenizer.ggml.pre`, byte-level decoding;
  - `llama` (sentencepiece BPE with byte fallback: Llama 2, Mistral): `▁` for spaces, merges from
    the file or recovered from the token scores.
Tokens typed CONTROL become special added tokens, USER_DEFINED ones plain added tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rillet.core.tokenizer.hf import bos_eos_processor
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

TOKEN_CONTROL = 3  # llama.cpp token types
TOKEN_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> split regex; any other value (gpt2, smollm, ...) uses GPT-2's own.
_PRE_SPLITS = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4"), _GPT4O_SPLIT),
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (bytes that print as themselves keep their code)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, codes, strict=True)}


def backend_from_gguf(meta: Mapping[str, Any]) -> Backend:
    kind = meta.get("tokenizer.ggml.model")
    if kind == "gpt2":
        backend = _byte_level(meta)
    elif kind == "llama":
        backend = _sentencepiece(meta)
    else:
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
    _add_special_tokens(backend, meta, byte_level=kind == "gpt2")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama"))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    backend.post_processor = _post_processor(meta, add_bos, add_eos)
    return backend


def _merges(meta: Mapping[str, Any], vocab: Mapping[str, int]) -> list[tuple[str, str]]:
    stored: Sequence[str] | None = meta.get("tokenizer.ggml.merges")
    if stored is not None:
        return [(a, b) for a, b in (m.split(" ", 1) for m in stored)]
    return _merges_from_scores(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], vocab)


def _merges_from_scores(
    tokens: Sequence[str], scores: Sequence[float], vocab: Mapping[str, int]
) -> list[tuple[str, str]]:
    # transformers' `generate_merges`: every split of a token into two known tokens, best score first.
    found: list[tuple[str, str, float]] = []
    for token, score in zip(tokens, scores, strict=True):
        splits = ((token[:i], token[i:]) for i in range(1, len(token)))
        local = [(a, b, score) for a, b in splits if a in vocab and b in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in found]


def _byte_level(meta: Mapping[str, Any]) -> Backend:
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # Tokens outside the byte alphabet (a few files store raw text) are respelled, as transformers does.
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): i
        for i, tok in enumerate(meta["tokenizer.ggml.tokens"])
    }
    backend = Backend(
        models.BPE(
            vocab=vocab,
            merges=_merges(meta, vocab),
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    split = _PRE_SPLITS.get(str(meta.get("tokenizer.ggml.pre")))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece(meta: Mapping[str, Any]) -> Backend:
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    backend = Backend(
        models.BPE(
            vocab=vocab,
            merges=_merges(meta, vocab),
            unk_token=tokens[unk_id] if unk_id is not None else None,
            fuse_unk=True,
            byte_fallback=True,
            dropout=None,
        )
    )
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _add_special_tokens(backend: Backend, meta: Mapping[str, Any], byte_level: bool) -> None:
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or ()
    alphabet = set(bytes_to_unicode().values()) if byte_level else None
    # A CONTROL token spelled outside the byte alphabet is a converter mislabel; adding it would
    # grow the vocabulary past the model's, so it is skipped (as transformers does).
    typed = list(zip(tokens, types, strict=False))  # old files may lack token types
    control = [t for t, kind in typed if kind == TOKEN_CONTROL and (alphabet is None or set(t) <= alphabet)]
    named = [tokens[i] for i in _named_special_ids(meta).values() if 0 <= i < len(tokens)]
    special = list(dict.fromkeys([*control, *named]))
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    vocab = backend.get_vocab(with_added_tokens=False)
    user = [t for t, kind in typed if kind == TOKEN_USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _named_special_ids(meta: Mapping[str, Any]) -> dict[str, int]:
    keys = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding"}
    found = {name: meta.get(f"tokenizer.ggml.{key}_token_id") for name, key in keys.items()}
    return {name: int(i) for name, i in found.items() if i is not None}


def special_token_strings(meta: Mapping[str, Any]) -> dict[str, str | None]:
    """`{"bos_token": "<s>", "eos_token": ..., "unk_token": ..., "pad_token": ...}` for templates."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    ids = _named_special_ids(meta)
    return {
        f"{name}_token": tokens[ids[name]] if name in ids and 0 <= ids[name] < len(tokens) else None
        for name in ("bos", "eos", "unk", "pad")
    }


def _post_processor(meta: Mapping[str, Any], add_bos: bool, add_eos: bool) -> processors.TemplateProcessing:
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    ids = _named_special_ids(meta)
    bos = (tokens[ids["bos"]], ids["bos"]) if add_bos and "bos" in ids else None
    eos = (tokens[ids["eos"]], ids["eos"]) if add_eos and "eos" in ids else None
    return bos_eos_processor(bos, eos)
