"""Shared fixtures. `tiny_hf_model` saves small random transformers models to disk once per session;
`lora_setup` LoRA adapters peft made for one of them; `st_folder` does the same for
sentence-transformers folders (embeddings)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from rillet.graphs.runner import GraphRunner
from tiny_models.lora_adapters import ADAPTERS, NEW, PROMPTS, greedy, make_adapter

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a model folder's path is never looked up on a hub


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs two workers) each worker gets one core: one torch thread
    per worker and per process it starts. Two workers of two threads each would oversubscribe the
    two cores, and OpenMP's spin-waiting turns that into a slowdown of several times."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    # xdist's loadfile queue is sorted by test count by default, which sends the modules of one or
    # two long tests (a compile, the numerics subprocesses) last: one worker then runs them alone
    # while the other idles. Queued in collection order instead, heavy modules first (below).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


HEAVY_MARKS = ("compiled", "slow")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a test marked `compiled` or `slow` first (stable: otherwise in collection
    order), so that under `--dist loadfile` the many short modules fill in at the end, whichever
    worker finishes its long ones first."""
    heavy = {_module_of(item) for item in items if any(item.get_closest_marker(m) for m in HEAVY_MARKS)}
    items.sort(key=lambda item: _module_of(item) not in heavy)


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


TinyHFModel = Callable[..., tuple[Path, Any]]  # (model_type, **config overrides) -> (folder, HF model)

TINY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "initializer_range": 0.1,  # peaky logits: greedy argmax never hinges on a near-tie
    "bos_token_id": None,
    "eos_token_id": None,  # generate() must not stop early in token-for-token comparisons
    "pad_token_id": None,
}


# Per family, on top of TINY_DEFAULTS: small sliding windows (prompts of the tests run past them),
# soft-caps and query scales that differ from the defaults a bug would fall back to.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3": {"head_dim": 16},
    "gemma2": {
        "head_dim": 16,
        "sliding_window": 8,
        "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": 4.0,
        "final_logit_softcapping": 8.0,
    },
    "gemma3_text": {
        "num_hidden_layers": 6,  # five sliding layers, then a global one
        "head_dim": 16,
        "sliding_window": 8,
        "query_pre_attn_scalar": 16,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
        },
    },
    "phi3": {  # longrope: positions from 48 on use the long factors
        "max_position_embeddings": 256,
        "original_max_position_embeddings": 48,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0 + 0.05 * i for i in range(8)],
            "long_factor": [1.5 + 0.5 * i for i in range(8)],
        },
    },
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 64},
    "qwen3_moe": {
        "head_dim": 16,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],  # a dense layer between MoE ones
    },
}


def _perturb_vectors(model: Any) -> None:
    # HF initialises norms to 1 and biases to 0, which would hide a swapped norm or a lost bias
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                base = 0.0 if name.endswith("bias") else 1.0
                p.copy_(base + 0.1 * torch.randn_like(p))


@pytest.fixture(scope="session")
def tiny_hf_model(tmp_path_factory: pytest.TempPathFactory) -> TinyHFModel:
    """Factory: `tiny_hf_model("llama", tie_word_embeddings=True)` -> (folder, fp32 HF model in eval).

    model_type is one of llama | mistral | qwen2 | qwen3 | gemma2 | gemma3_text | phi3 | mixtral |
    qwen3_moe (FAMILY_DEFAULTS adds what a family needs on top of TINY_DEFAULTS); identical
    arguments reuse the saved folder.
    """
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
        "gemma3_text": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
    }
    made: dict[str, tuple[Path, Any]] = {}

    def make(
        model_type: str, seed: int = 0, max_shard_size: str | None = None, **overrides: Any
    ) -> tuple[Path, Any]:
        key = repr((model_type, seed, max_shard_size, sorted(overrides.items())))
        if key not in made:
            config_cls, model_cls = classes[model_type]
            torch.manual_seed(seed)
            config = config_cls(**{**TINY_DEFAULTS, **FAMILY_DEFAULTS.get(model_type, {}), **overrides})
            model = model_cls(config).eval()
            _perturb_vectors(model)
            folder = tmp_path_factory.mktemp(f"hf_{model_type}")
            kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
            model.save_pretrained(folder, **kwargs)
            made[key] = (folder, model)
        return made[key]

    return make


@pytest.fixture(scope="session", autouse=True)
def _compile_switch() -> Iterator[dict[str, bool]]:
    """`graphs.enabled: auto` compiles the decode step on CPU, on a background thread, for every
    engine. Only tests marked `compiled` (a module's pytestmark, or a test's own mark) build it;
    the others run eager: dozens of compiles would cost minutes of the suite's budget, and a
    compile left running competes for the 2 cores with the tests after it. Patched for the whole
    session, so that module- and session-scoped fixtures (set up before any function-scoped
    fixture) are covered too."""
    switch = {"on": False}
    real = GraphRunner.start_compile

    def start_compile(self: GraphRunner, background: bool = True) -> None:
        if switch["on"]:
            real(self, background)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GraphRunner, "start_compile", start_compile)
        yield switch


@pytest.fixture(scope="session", autouse=True)
def _artifacts_switch() -> Iterator[dict[str, bool]]:
    """`graphs.artifacts: on` (the default) saves the compiled CPU step under model.cache_dir and
    builds a missing one in a child process. Only tests marked `artifacts` take that path; the other
    compiled tests keep testing torch.compile, and none writes into the user's cache folder."""
    from rillet.core import graph_setup

    switch = {"on": False}
    real = graph_setup.artifact_plan

    def artifact_plan(cfg: Any, model: Any, in_process: bool = False) -> Any:
        return real(cfg, model, in_process) if switch["on"] else None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graph_setup, "artifact_plan", artifact_plan)
        yield switch


@pytest.fixture(scope="session", autouse=True)
def _short_prefill_switch() -> Iterator[dict[str, bool]]:
    """`graphs.short_prefill` (on by default) builds the compiled multi-query step beside the decode
    step even with speculation off: two more compiles per compiled engine. Only tests marked
    `short_prefill` get it built for that alone; an engine that speculates builds it anyway (and
    its short prefill steps run through it)."""
    from rillet.core import graph_setup

    switch = {"on": False}
    real = graph_setup.verify_queries

    def verify_queries(cfg: Any, model: Any, mode: str) -> int:
        return real(cfg, model, mode) if switch["on"] or cfg.speculative.enabled else 0

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graph_setup, "verify_queries", verify_queries)
        yield switch


@pytest.fixture(scope="module", autouse=True)
def _short_prefill_in_marked_modules(
    request: pytest.FixtureRequest, _short_prefill_switch: dict[str, bool]
) -> Iterator[None]:
    _short_prefill_switch["on"] = request.node.get_closest_marker("short_prefill") is not None
    yield
    _short_prefill_switch["on"] = False


@pytest.fixture(scope="module", autouse=True)
def _artifacts_in_marked_modules(
    request: pytest.FixtureRequest, _artifacts_switch: dict[str, bool]
) -> Iterator[None]:
    _artifacts_switch["on"] = request.node.get_closest_marker("artifacts") is not None
    yield
    _artifacts_switch["on"] = False


@pytest.fixture(scope="module", autouse=True)
def _compile_in_marked_modules(
    request: pytest.FixtureRequest, _compile_switch: dict[str, bool]
) -> Iterator[None]:
    _compile_switch["on"] = request.node.get_closest_marker("compiled") is not None
    yield
    _compile_switch["on"] = False


@pytest.fixture(autouse=True)
def _compile_in_marked_tests(
    request: pytest.FixtureRequest, _compile_switch: dict[str, bool]
) -> Iterator[None]:
    before = _compile_switch["on"]
    _compile_switch["on"] = request.node.get_closest_marker("compiled") is not None
    yield
    _compile_switch["on"] = before


# ---- LoRA adapters --------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def lora_setup(tiny_hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """{"folder": base model, "paths": name -> adapter folder, "refs": name (None: base) -> tokens
    per prompt of PROMPTS}, the references generated one prompt at a time (no padding)."""
    folder, hf = tiny_hf_model("llama")
    root = tmp_path_factory.mktemp("lora")
    paths: dict[str, str] = {}
    refs: dict[str | None, list[list[int]]] = {None: [greedy(hf, p, NEW) for p in PROMPTS]}
    for i, (name, r, alpha, targets, rslora) in enumerate(ADAPTERS):
        peft_model = make_adapter(
            hf, root / name, r=r, alpha=alpha, targets=targets, seed=i + 1, use_rslora=rslora
        )
        paths[name] = str(root / name)
        refs[name] = [greedy(peft_model, p, NEW) for p in PROMPTS]
    return {"folder": str(folder), "paths": paths, "refs": refs, "hf": hf, "root": root}


@pytest.fixture(scope="session")
def st_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
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


def _perturb(model: Any) -> None:
    # HF initialises norms to 1 and biases to 0, which would hide a swapped norm or a lost bias
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_((0.0 if name.endswith("bias") else 1.0) + 0.1 * torch.randn_like(p))


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
    _perturb(model)
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
    _perturb(model)
    hf = root / "hf"
    model.save_pretrained(hf)
    fast.save_pretrained(hf)
    return _save_st(hf, root / "st", pooling, normalize, max_seq_length)
