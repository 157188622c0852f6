"""Reading a Hugging Face tokenizer folder: tokenizer.json, tokenizer_config.json, the chat template
(inline, or chat_template.jinja) and generation_config.json's extra end-of-sequence ids."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers import processors

_NAMED = ("bos_token", "eos_token", "unk_token", "pad_token")


@dataclass(frozen=True)
class HFTokenizerParts:
    backend: Backend
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    special_tokens: dict[str, str | None] = field(default_factory=dict)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or a serialized AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value]
    return [] if value is None else [int(value)]


def read_hf_folder(folder: Path) -> HFTokenizerParts:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {folder}")
    backend = Backend.from_file(str(path))
    # A tokenizer.json may carry padding and truncation settings (older sentence-transformers
    # models: pad to a fixed 128, cut at 128); transformers ignores them, so does rillet: a prompt is
    # its own tokens, and the server checks its length itself.
    backend.no_padding()
    backend.no_truncation()
    config = _read_json(folder / "tokenizer_config.json")
    special = {name: _token_text(config.get(name)) for name in _NAMED}
    bos = special["bos_token"]
    bos_id = backend.token_to_id(bos) if bos else None
    eos = special["eos_token"]
    eos_ids = [backend.token_to_id(eos)] if eos else []
    eos_ids += _ids(_read_json(folder / "generation_config.json").get("eos_token_id"))
    if "add_bos_token" in config or "add_eos_token" in config:
        # transformers rebuilds the post-processor from these flags when the config names them.
        backend.post_processor = bos_eos_processor(
            (bos, bos_id) if config.get("add_bos_token") and bos and bos_id is not None else None,
            (eos, eos_ids[0]) if config.get("add_eos_token") and eos and eos_ids[0] is not None else None,
        )
    return HFTokenizerParts(
        backend=backend,
        chat_template=_chat_template(folder, config),
        bos_token_id=bos_id,
        eos_token_ids=tuple(i for i in eos_ids if i is not None),
        special_tokens=special,
    )


def bos_eos_processor(
    bos: tuple[str, int] | None, eos: tuple[str, int] | None
) -> processors.TemplateProcessing:
    head = f"{bos[0]}:0 " if bos else ""
    tail = f" {eos[0]}:0" if eos else ""
    single = f"{head}$A:0{tail}"
    pair = f"{single} {head.replace(':0', ':1')}$B:1{tail.replace(':0', ':1')}"
    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[t for t in (bos, eos) if t is not None]
    )
