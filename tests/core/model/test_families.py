"""Reading configs the way transformers does for the spellings the tiny models do not write: a
multimodal Gemma 3 (a sparse `text_config`, `language_model.` weights), configs from before
`layer_types`, an unsupported model_type, partial rotary embeddings."""

from __future__ import annotations

import pytest
from rillet.core.config import ConfigError
from rillet.core.model.arch import ModelArch
from rillet.core.model.families import arch_from_hf_config
from rillet.core.model.weights import Part, canonical_parts

GEMMA3_4B = {  # google/gemma-3-4b-it's config.json, in substance
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "eos_token_id": [1, 106],
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"model_type": "siglip_vision_model"},
}


def test_multimodal_gemma3_runs_its_language_model() -> None:
    a = arch_from_hf_config(GEMMA3_4B)
    assert (a.architecture, a.vocab_size, a.hidden_size, a.num_layers) == ("gemma3_text", 262208, 2560, 34)
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.attn_scale) == (8, 4, 256, 256**-0.5)
    assert a.sliding_window == 1024 and a.sliding_layers == tuple(i for i in range(34) if (i + 1) % 6)
    assert a.rope_theta == 1e6 and a.rope_scaling == {"factor": 8.0, "rope_type": "linear"}
    assert a.rope_local_theta == 10000.0 and a.uses_local_rope and a.qk_norm and a.attn_softcap is None
    assert a.eos_token_ids == (1, 106) and a.tie_word_embeddings and a.norm_offset == 1.0
    shape = (2560,)
    assert canonical_parts("language_model.model.layers.3.input_layernorm.weight", shape, a) == [
        Part("model.layers.3.input_layernorm.weight", ())
    ]
    assert canonical_parts("model.language_model.norm.weight", shape, a) == [Part("model.norm.weight", ())]
    assert canonical_parts("vision_tower.vision_model.embeddings.patch_embedding.weight", shape, a) == []
    assert canonical_parts("model.multi_modal_projector.mm_soft_emb_norm.weight", shape, a) == []


def test_configs_from_before_layer_types() -> None:
    base = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 256}
    gemma2 = arch_from_hf_config(
        {**base, "model_type": "gemma2", "num_hidden_layers": 4, "sliding_window": 8}
    )
    assert gemma2.sliding_layers == (0, 2) and gemma2.attn_softcap is None and gemma2.hidden_act == "silu"
    mistral = arch_from_hf_config(
        {**base, "model_type": "mistral", "num_hidden_layers": 3, "sliding_window": 16}
    )
    assert mistral.sliding_layers == (0, 1, 2) and mistral.layer_window(1) == 16
    qwen2 = {
        **base,
        "model_type": "qwen2",
        "num_hidden_layers": 4,
        "sliding_window": 16,
        "max_window_layers": 2,
    }
    assert arch_from_hf_config(qwen2).sliding_layers == ()  # use_sliding_window defaults to off there
    assert arch_from_hf_config({**qwen2, "use_sliding_window": True}).sliding_layers == (2, 3)
    # a window as long as the context masks nothing (but Gemma 3's local layers keep their RoPE)
    long = arch_from_hf_config(
        {**base, "model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 4096}
    )
    assert long.sliding_window is None and not long.has_windows and long.layer_window(0) is None


def test_unsupported_configs_are_one_line_naming_the_key() -> None:
    with pytest.raises(
        ConfigError, match=r"'model\.path': model_type 'gpt2' is not supported \(supported: llama, "
    ):
        arch_from_hf_config({"model_type": "gpt2"})
    phi4_mini = {
        "model_type": "phi3",
        "partial_rotary_factor": 0.75,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 8,
    }
    with pytest.raises(ConfigError, match=r"partial rotary embeddings \(partial_rotary_factor 0\.75\)"):
        arch_from_hf_config(phi4_mini)


def test_biases_the_layers_do_not_hold_are_refused_by_key() -> None:
    """A loaded weight named o_proj.bias or gate_proj.bias was the error before: refused at the
    config instead, naming the key. Qwen2's q/k/v biases (no key) are the layers' own."""
    tiny = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 8}
    for model_type, key in (("llama", "attention_bias"), ("qwen3", "attention_bias"), ("llama", "mlp_bias")):
        with pytest.raises(ConfigError, match=key) as err:
            arch_from_hf_config({"model_type": model_type, key: True, **tiny})
        assert err.value.key == "model.path"
    assert arch_from_hf_config({"model_type": "qwen2", **tiny}).attention_bias
    assert not arch_from_hf_config({"model_type": "llama", "attention_bias": False, **tiny}).attention_bias


def test_arch_json_round_trip() -> None:
    a = arch_from_hf_config(GEMMA3_4B)
    assert ModelArch.from_json(a.to_json()) == a
