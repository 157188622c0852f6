"""The tokenizer: HF `tokenizers` (Rust) for encode/decode, Jinja for chat templates, and the raw
bytes each token adds to decoded text (the incremental detokenizer is built on them).

Built from a GGUF file's metadata or from a Hugging Face folder (tokenizer.json +
tokenizer_config.json). Thread-safe: the Rust object is never mutated after construction, so one
thread may encode while another decodes.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from rillet.core.loaders.gguf_file import read_gguf
from rillet.core.tokenizer.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    ChatTemplateError,
    compile_chat_template,
    fold_system_message,
    render_chat_template,
)
from rillet.core.tokenizer.gguf import backend_from_gguf, bytes_to_unicode, special_token_strings
from rillet.core.tokenizer.hf import read_hf_folder
from tokenizers import Tokenizer as Backend

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
DecodeStyle = Literal["byte_level", "sentencepiece", "plain"]
# Texts at least this long (~500-1,000 tokens, ~0.5 ms of encoding) are encoded with the GIL released.
GIL_FREE_CHARS = 2048


class Tokenizer:
    def __init__(
        self,
        backend: Backend,
        *,
        chat_template: str | None = None,
        bos_token_id: int | None = None,
        eos_token_ids: tuple[int, ...] = (),
        special_tokens: Mapping[str, str | None] | None = None,
    ) -> None:
        """`special_tokens`: the `bos_token` / `eos_token` / ... strings chat templates may use."""
        self._backend = backend
        self.chat_template = chat_template or DEFAULT_CHAT_TEMPLATE
        self._template = compile_chat_template(self.chat_template)
        self._special_tokens = dict(special_tokens or {})
        self.system_role = self._accepts_system_role()
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(dict.fromkeys(eos_token_ids))
        added = backend.get_added_tokens_decoder()
        self.special_token_ids = frozenset(i for i, tok in added.items() if tok.special)
        ids = backend.get_vocab(with_added_tokens=True).values()
        self.vocab_size = max(ids) + 1 if ids else 0
        self._style, self._spiece = _decode_style(backend)
        self._unicode_to_byte = {c: b for b, c in bytes_to_unicode().items()}
        self._bytes_table: list[bytes] | None = None
        self._table_lock = threading.Lock()

    # ---- construction ------------------------------------------------------------------

    @classmethod
    def from_path(cls, path: str | Path) -> Tokenizer:
        """A .gguf file, or a folder holding tokenizer.json."""
        p = Path(path)
        return cls.from_hf_folder(p) if p.is_dir() else cls.from_gguf(p)

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        return cls.from_gguf_metadata(read_gguf(path).metadata)

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
        bos = meta.get("tokenizer.ggml.bos_token_id")
        return cls(
            backend_from_gguf(meta),
            chat_template=meta.get("tokenizer.chat_template"),
            bos_token_id=int(bos) if bos is not None else None,
            eos_token_ids=tuple(int(i) for i in eos if i is not None),
            special_tokens=special_token_strings(meta),
        )

    @classmethod
    def from_hf_folder(cls, path: str | Path) -> Tokenizer:
        parts = read_hf_folder(Path(path))
        return cls(
            parts.backend,
            chat_template=parts.chat_template,
            bos_token_id=parts.bos_token_id,
            eos_token_ids=parts.eos_token_ids,
            special_tokens=parts.special_tokens,
        )

    # ---- text <-> ids ------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Special-token text in `text` (e.g. `<|im_end|>`) becomes the special token, as in HF.

        A long text is encoded without the GIL: `tokenizers`' `encode` holds it for the whole
        call (~1 ms a thousand tokens here), a stall no other thread can preempt, so a long prompt
        tokenized on the server's worker thread would stop the engine thread's step preparation
        and every stream's writes for as long. `encode_batch` releases it while the Rust side
        works. A short text keeps `encode`: releasing and taking the GIL back costs more there
        (another thread waiting for it runs first)."""
        if len(text) < GIL_FREE_CHARS:
            enc = self._backend.encode(text, add_special_tokens=add_special_tokens)
        else:
            (enc,) = self._backend.encode_batch([text], add_special_tokens=add_special_tokens)
        ids: list[int] = enc.ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text: str = self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return text

    def backend_json(self) -> str:
        """The `tokenizers` serialization of the backend (what grammar engines build their own from)."""
        text: str = self._backend.to_str()
        return text

    def id_to_token(self, i: int) -> str:
        """The vocabulary entry (in its stored spelling, e.g. `Ġhello`); "" for an unknown id."""
        tok = self._backend.id_to_token(i) if 0 <= i < self.vocab_size else None
        return tok if tok is not None else ""

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **template_vars: Any
    ) -> str:
        """Raises `ChatTemplateError` (a ValueError) for messages the template rejects.

        A template without a system role (Gemma 2's raises on one) gets the system message folded
        into the first user turn, as Gemma 3's template does itself: "<system>\n\n<user>"."""
        if not self.system_role:
            messages = fold_system_message(messages)
        return render_chat_template(
            self._template, messages, add_generation_prompt, self._special_tokens, **template_vars
        )

    def _accepts_system_role(self) -> bool:
        probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        try:
            render_chat_template(self._template, probe, True, self._special_tokens)
        except ChatTemplateError:
            try:  # the template refuses something else too: leave its messages alone
                render_chat_template(self._template, probe[1:], True, self._special_tokens)
            except ChatTemplateError:
                return True
            return False
        return True

    # ---- bytes per token ---------------------------------------------------------------

    def token_bytes(self, i: int) -> bytes | None:
        """The raw bytes token `i` adds to `decode(..., skip_special_tokens=True)` output.

        None for special tokens (skipped) and unknown ids. Concatenating the bytes of a sequence
        and decoding as UTF-8 (errors="replace") gives `decode(ids)`, with one exception for
        sentencepiece vocabularies: `decode` drops the space of a leading `▁` on the very first
        token of a sequence; these bytes keep it (right for text that continues a prompt).
        """
        if i in self.special_token_ids or not 0 <= i < self.vocab_size:
            return None
        tok = self._backend.id_to_token(i)
        if tok is None:
            return None
        if self._style == "byte_level":
            to_byte = self._unicode_to_byte
            # The ByteLevel decoder passes a token with any character outside its alphabet through as text.
            if all(c in to_byte for c in tok):
                return bytes(to_byte[c] for c in tok)
            return tok.encode("utf-8")
        if self._style == "sentencepiece":
            m = _BYTE_TOKEN.match(tok)
            if m is not None:
                return bytes((int(m.group(1), 16),))
            return tok.replace(self._spiece, " ").encode("utf-8")
        return tok.encode("utf-8")

    def token_bytes_table(self) -> list[bytes]:
        """`token_bytes(i)` for every id, with b"" where it is None; built once, then shared."""
        with self._table_lock:
            if self._bytes_table is None:
                self._bytes_table = [self.token_bytes(i) or b"" for i in range(self.vocab_size)]
            return self._bytes_table


def _decode_style(backend: Backend) -> tuple[DecodeStyle, str]:
    """How the backend's decoder turns tokens into text, and the sentencepiece space character."""
    if backend.decoder is None:
        return "plain", "▁"
    steps = json.loads(backend.decoder.__getstate__())
    flat = steps.get("decoders", [steps]) if steps.get("type") == "Sequence" else [steps]
    types = {s.get("type") for s in flat}
    if "ByteLevel" in types:
        return "byte_level", "▁"
    for s in flat:
        if s.get("type") == "Metaspace":
            return "sentencepiece", str(s.get("replacement", "▁"))
        if s.get("type") == "Replace" and s.get("content") == " ":
            return "sentencepiece", str(s.get("pattern", {}).get("String", "▁"))
    if "ByteFallback" in types:
        return "sentencepiece", "▁"
    return "plain", "▁"
