"""Logits of rillet against Hugging Face transformers on the same random weights.

transformers builds the model from rillet's own ModelArch (so the shape presets are what is
tested), in bf16, with perturbed norms; rillet loads its state dict through `load_weights` (HF
names) and runs a prefill then single-token decodes through the paged cache with the chosen
attention backend. Both bf16 results are compared with transformers in fp32 on the same weights.
"""

from __future__ import annotations

from typing import Any

import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.attention.select import create_attention_backend
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder import DecoderModel, allocate_kv_cache, build_model

from bench.gpu.timing import random_ids
from bench.lib.common import hf_config_kwargs


def hf_model(arch: ModelArch, device: torch.device, dtype: torch.dtype, seed: int) -> Any:
    """A random transformers model with exactly `arch`, norms perturbed (a swapped norm shows)."""
    import transformers

    kinds: dict[str, tuple[Any, Any]] = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }
    config_cls, model_cls = kinds[arch.architecture]
    extra = {"sliding_window": None} if arch.architecture == "mistral" else {}
    cfg = config_cls(
        **hf_config_kwargs(arch),
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **extra,
    )
    rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": getattr(cfg, "rope_theta", None)}
    if rope.get("rope_theta") != arch.rope_theta:
        raise RuntimeError(
            f"transformers config kept rope_theta {rope.get('rope_theta')}, not {arch.rope_theta}"
        )
    torch.manual_seed(seed)
    with torch.device(device):
        hf = model_cls._from_config(cfg, dtype=dtype).eval().to(device)  # .to: in case init ignored it
        with torch.no_grad():
            for _, p in hf.named_parameters():
                if p.dim() == 1:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return hf


def paged_logits(model: DecoderModel, ids: list[int], n_decode: int, block_size: int) -> torch.Tensor:
    """Logits [T, V] (fp32) of a prefill of ids[:-n_decode], then n_decode one-token decode steps,
    through the paged cache: both attention paths (prefill and decode kernels) of the backend."""
    device = model.embed_tokens.device
    t, nb = len(ids), -(-len(ids) // block_size)
    kv = allocate_kv_cache(model.arch, nb + 1, block_size, model.embed_tokens.dtype, device)
    table = torch.arange(1, nb + 1, dtype=torch.int32, device=device)[None]  # block 0 is the dummy
    out = []

    def step(start: int, end: int) -> None:
        n = end - start
        meta = AttentionMetadata(
            slot_mapping=torch.arange(start, end, device=device) + block_size,  # pos p -> slot bs + p
            query_start=torch.tensor([0, n], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([end], dtype=torch.int32, device=device),
            block_tables=table,
            query_lens_cpu=[n],
            seq_lens_cpu=[end],
            block_size=block_size,
            num_prefills=1 if n > 1 else 0,
        )
        model.backend.begin_step(meta)
        tokens = torch.tensor(ids[start:end], device=device)
        hidden = model(tokens, torch.arange(start, end, device=device), kv, meta)
        out.append(model.compute_logits(hidden))

    prefill = t - n_decode
    step(0, prefill)
    for i in range(prefill, t):
        step(i, i + 1)
    return torch.cat(out)


def logit_stats(x: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    d = (x.double() - ref.double()).norm() / ref.double().norm()
    return {
        "rel_err": float(d),
        "max_abs": float((x - ref).abs().max()),
        "top1_agree": float((x.argmax(-1) == ref.argmax(-1)).float().mean()),
        "finite": bool(torch.isfinite(x).all()),
    }


def compare_logits(
    arch: ModelArch,
    device: torch.device,
    backend: str,
    prompt_len: int,
    n_decode: int,
    seed: int = 0,
    prefill_kernels: str = "fa2",
) -> dict[str, Any]:
    """rillet (bf16, `backend`) and transformers (bf16) against transformers in fp32, same weights.
    `prefill_kernels`: flashinfer's prefill kernels, as attention.flashinfer_prefill_backend."""
    hf = hf_model(arch, device, torch.bfloat16, seed)
    ids = random_ids(prompt_len, arch.vocab_size, torch.Generator().manual_seed(seed + 1))
    x = torch.tensor([ids], device=device)
    with torch.inference_mode():
        hf_bf16 = hf(x).logits[0].float()
    block = 16
    be = create_attention_backend(
        backend,
        arch,
        block_size=block,
        dtype=torch.bfloat16,
        device=device,
        flashinfer_prefill_backend=prefill_kernels,
    )
    model = build_model(arch, be, torch.bfloat16, device)
    with torch.no_grad():
        model.load_weights(hf.state_dict().items())
    with torch.inference_mode():
        ours = paged_logits(model, ids, n_decode, block)
    del model, be
    with torch.no_grad():
        hf.float()  # the same (bf16-representable) weights, fp32 arithmetic: the reference
    with torch.inference_mode():
        ref = hf(x).logits[0].float()
    attn = str(getattr(hf.config, "_attn_implementation", "?"))
    del hf
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "prompt_len": prompt_len,
        "decode_steps": n_decode,
        "backend": backend,
        "prefill_kernels": prefill_kernels if backend == "flashinfer" else None,
        "hf_attn": attn,
        "rillet_vs_fp32": logit_stats(ours, ref),
        "hf_bf16_vs_fp32": logit_stats(hf_bf16, ref),
        "rillet_vs_hf_bf16": logit_stats(ours, hf_bf16),
    }
