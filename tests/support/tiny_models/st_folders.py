"""Tiny random sentence-transformers folders (embeddings): the builder behind tests/conftest.py's
session fixture `st_folder`. A 2-layer BERT over a WordPiece vocabulary of a few dozen words, or a
2-layer Llama over the default model's tokenizer, each saved by sentence-transformers itself
(Transformer, Pooling and optionally Normalize modules) as it writes a model for the hub; the
models' 1-d weights are perturbed so that a swapped norm or a lost bias shows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tiny_models.hf_folders import perturb_vectors


def make_st_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: `st_folder("bert" | "decoder", pooling=..., normalize=...)` -> a tiny random
    sentence-transformers folder (built below); identical arguments reuse it."""
    made: dict[str, Path] = {}

    def make(family: str, **kwargs: Any) -> Path:
        key = repr((family, sorted(kwargs.items())))
        if key not in made:
            build = _bert_folder if family == "bert" else _decoder_folder
            made[key] = build(tmp_path_factory.mktemp(f"st_{family}"), **kwargs)
        return made[key]

    return make


# ---- tiny random sentence-transformers folders ---------------------------------------------------
# `_bert_folder`: a 2-layer BERT with a WordPiece vocabulary of a few dozen words (the `tokenizers`
# library, wrapped in transformers' BertTokenizerFast). `_decoder_folder`: a 2-layer Llama over the
# default model's tokenizer (49152 ids). Each is saved by `SentenceTransformer(modules=[Transformer,
# Pooling, Normalize]).save`, as sentence-transformers writes a model for the hub.

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "hello",
    "world",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "and",
    "of",
    "to",
    "in",
    "is",
    "it",
    "red",
    "blue",
    "green",
    "house",
    "tree",
    "river",
    "stone",
    "light",
    "night",
    "day",
    "sun",
    "moon",
    "star",
    "sky",
    "rain",
    ",",
    ".",
    "!",
    "?",
]
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
BERT_VOCAB = list(dict.fromkeys(BERT_SPECIALS + WORDS + list(LETTERS) + [f"##{c}" for c in LETTERS]))


def _save_st(hf_dir: Path, out: Path, pooling: str, normalize: bool, max_seq_length: int) -> Path:
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6 (the old path warns)
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models  # type: ignore[no-redef]

    transformer = models.Transformer(str(hf_dir), max_seq_length=max_seq_length)
    modules: list[Any] = [transformer, models.Pooling(transformer.get_embedding_dimension(), pooling)]
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


def _bert_folder(
    root: Path, pooling: str = "mean", normalize: bool = True, max_seq_length: int = 48, seed: int = 0
) -> Path:
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(BERT_VOCAB)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    fast = transformers.BertTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    cfg = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_act="gelu",
    )
    torch.manual_seed(seed)
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    perturb_vectors(model)
    hf = root / "hf"
    model.save_pretrained(hf)
    fast.save_pretrained(hf)
    return _save_st(hf, root / "st", pooling, normalize, max_seq_length)


def _decoder_folder(
    root: Path, pooling: str = "lasttoken", normalize: bool = True, max_seq_length: int = 200, seed: int = 0
) -> Path:
    import transformers
    from rillet.core.loaders.default_model import default_model_path
    from rillet.core.tokenizer.tokenizer import Tokenizer
    from tokenizers import Tokenizer as Backend

    backend = Backend.from_str(Tokenizer.from_gguf(default_model_path()).backend_json())
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|im_end|>"
    )
    cfg = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.1,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaModel(cfg).eval()
    perturb_vectors(model)
    hf = root / "hf"
    model.save_pretrained(hf)
    fast.save_pretrained(hf)
    return _save_st(hf, root / "st", pooling, normalize, max_seq_length)
