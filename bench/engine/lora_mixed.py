"""Multi-LoRA serving: tokens/s of a batch of 8 (c = 8) with 4 adapters mixed vs the base model alone,
and what each adapter costs in memory.

Two engines on the same model live in one process and are measured in turns (base, lora, base,
lora, ...), best of `--reps` per cell, so that a noisy machine shifts both alike:
  base         an engine without LoRA, base-model requests;
  lora-base    the LoRA engine (4 adapters loaded), base-model requests only (the price of the
               LoRA path itself: the compiled step computes it for every row);
  lora-mixed   the LoRA engine, the batch's requests spread over the 4 adapters (2 each).
Each cell is a batch of `--batch` requests submitted together (random prompts of `--prompt-len`
tokens, `--tokens` greedy tokens, EOS ignored, no prefix caching): tok/s = generated tokens over
the batch's wall time (prefill included). The adapters are random PEFT-format folders written to
a temporary directory (rank `--rank`, every projection targeted, or `--targets`: the LoRA engine's
`lora.target_modules` too), checked and loaded by the engine like any other. Memory per adapter:
its host copy (A and B, float32), its slot in the stacked device buffers (`lora.dtype`, allocated
once for `--adapters` slots), and the process's RSS growth per adapter while loading them (the
host copy: placing it in a slot allocates nothing).

Both engines serve the compiled decode step (`graphs.enabled: on`; this script waits for the
background compiles). Not `auto`: its check times compiled against eager once, and on a loaded
host it kept eager for one engine and compiled for the other (measured: 19.6 tok/s eager vs 65
compiled for the same base engine), which made the ratio a coin toss. `--set graphs.enabled=auto`
gives it back; the decode path of each engine is printed and written to the JSON either way.

    .venv/bin/python -m bench.engine.lora_mixed [--batch 8] [--adapters 4] [--rank 16] [--tokens 64]
        [--prompt-len 128] [--reps 3] [--set section.key=value ...]
    .venv/bin/python -m bench.engine.lora_mixed --tokens 4 --prompt-len 16 --reps 1   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.lora.adapter import module_shapes
from rillet.core.model.arch import ModelArch
from rillet.core.sampling_params import SamplingParams
from safetensors.torch import save_file

from bench.lib.common import decode_path, peak_rss_mib, table, write_json

log = logging.getLogger(__name__)
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_adapter(folder: Path, arch: ModelArch, rank: int, targets: tuple[str, ...], seed: int) -> None:
    """A random adapter in PEFT's format (as peft's save_pretrained writes one)."""
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for (layer, module), (d_in, d_out) in module_shapes(arch).items():
        if module not in targets:
            continue
        group = "self_attn" if module in _ATTN else "mlp"
        key = f"base_model.model.model.layers.{layer}.{group}.{module}"
        tensors[f"{key}.lora_A.weight"] = torch.randn(rank, d_in, generator=gen) / d_in**0.5
        tensors[f"{key}.lora_B.weight"] = torch.randn(d_out, rank, generator=gen) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(targets),
        "bias": "none",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))


def rss_mib() -> float:
    """Current resident set size (Linux /proc), in MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def make_llm(lora: dict[str, Any] | None, overrides: list[str]) -> LLM:
    data: dict[str, Any] = {
        "cache": {"num_blocks": 1024, "prefix_caching": False},  # no hits between turns
        "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 8192},
        "graphs": {"enabled": "on"},  # both engines the same step (module docstring)
    }
    if lora is not None:
        data["lora"] = lora
    return LLM(config_from_dict(data, overrides))


def timed(llm: LLM, batch: list[list[int]], tokens: int, loras: list[str | None]) -> tuple[float, int]:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(batch, params, lora=loras)
    wall = time.perf_counter() - t0
    return wall, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", nargs="*", default=list(ALL))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value")
    ap.add_argument("--out", default="bench/results/lora_mixed.json")
    args = ap.parse_args()

    base = make_llm(None, args.overrides)
    path = decode_path(base)
    arch = base.engine.runtime.arch
    assert arch is not None
    tmp = Path(tempfile.mkdtemp(prefix="rillet-lora-bench-"))
    names = [f"lora{i}" for i in range(args.adapters)]
    for i, name in enumerate(names):
        write_adapter(tmp / name, arch, args.rank, tuple(args.targets), seed=i + 1)
    rss0 = rss_mib()
    # the buffers hold the projections the adapters target, as a server configured for them would
    # (none at start-up would otherwise mean all seven)
    settings = {
        "max_loras": args.adapters,
        "max_rank": args.rank,
        "allow_runtime_updates": True,
        "target_modules": list(args.targets),
    }
    lora = make_llm(settings, args.overrides)  # no adapter yet: buffers only
    rss1 = rss_mib()
    for name in names:
        lora.engine.load_lora(name, str(tmp / name))
    rss2 = rss_mib()
    lora_path = decode_path(lora)
    registry = lora.engine.lora
    assert registry is not None

    rng = random.Random(0)
    vocab = arch.vocab_size
    batch = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(args.batch)]
    mixed: list[str | None] = [names[i % len(names)] for i in range(args.batch)]
    cells = {
        "base": (base, [None] * args.batch),
        "lora-base": (lora, [None] * args.batch),
        "lora-mixed": (lora, mixed),
    }
    for llm, loras in cells.values():  # warm-up: every adapter placed, every shape run once
        timed(llm, batch, 2, loras)
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.reps):
        for name, (llm, loras) in cells.items():
            wall, toks = timed(llm, batch, args.tokens, loras)
            if name not in best or wall < best[name][0]:
                best[name] = (wall, toks)
    rows = []
    for name, (wall, toks) in best.items():
        tok_s = toks / wall
        rows.append({"cell": name, "tok/s": tok_s, "vs base": tok_s / (best["base"][1] / best["base"][0])})
    infos = registry.infos()
    memory = {
        "host_mib_per_adapter": sum(a.nbytes for a in infos) / len(infos) / 2**20,  # its A and B, fp32
        "slot_mib_per_adapter": registry.stack.slot_bytes / 2**20,  # its share of the stacked buffers
        "buffers_mib": registry.stack.slot_bytes * registry.stack.slots / 2**20,  # allocated up front
        "lora_engine_rss_mib": rss1 - rss0,  # the whole second engine: weights, KV pool, buffers
        "rss_mib_per_adapter_loaded": (rss2 - rss1) / len(names),
    }
    base.close()
    lora.close()
    write_json(
        args.out,
        {
            "args": vars(args),
            "decode_path": {"base": path, "lora": lora_path},
            "lora_dtype": str(registry.stack.dtype).removeprefix("torch."),
            "rows": rows,
            "memory": memory,
            "peak_rss_mib": peak_rss_mib(),
        },
    )
    print(json.dumps(memory, indent=2))
    if path != lora_path:
        log.warning("the two engines run different decode steps: the ratio compares them too")
    dtype = str(registry.stack.dtype).removeprefix("torch.")
    print(f"peak RSS {peak_rss_mib():.0f} MiB; decode step: base {path}, lora {lora_path}; ", end="")
    print(f"LoRA buffers {dtype}; JSON: {args.out}")
    print(table(rows, ["cell", "tok/s", "vs base"]))


if __name__ == "__main__":
    main()
