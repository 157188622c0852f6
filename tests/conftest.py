"""Shared fixtures. `tiny_hf_model` saves small random transformers models to disk once per session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from rillet.graphs.runner import GraphRunner

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

    model_type is one of llama | mistral | qwen2; identical arguments reuse the saved folder.
    """
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }
    made: dict[str, tuple[Path, Any]] = {}

    def make(
        model_type: str, seed: int = 0, max_shard_size: str | None = None, **overrides: Any
    ) -> tuple[Path, Any]:
        key = repr((model_type, seed, max_shard_size, sorted(overrides.items())))
        if key not in made:
            config_cls, model_cls = classes[model_type]
            torch.manual_seed(seed)
            model = model_cls(config_cls(**{**TINY_DEFAULTS, **overrides})).eval()
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


@pytest.fixture(scope="session")
def st_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: `st_folder("bert" | "decoder", pooling=..., normalize=...)` -> a tiny random
    sentence-transformers folder (tests/support/st_models.py); identical arguments reuse it."""
    import st_models

    made: dict[str, Path] = {}

    def make(family: str, **kwargs: Any) -> Path:
        key = repr((family, sorted(kwargs.items())))
        if key not in made:
            build = st_models.bert_folder if family == "bert" else st_models.decoder_folder
            made[key] = build(tmp_path_factory.mktemp(f"st_{family}"), **kwargs)
        return made[key]

    return make
