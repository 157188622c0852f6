"""What bench/gpu/check.py runs with: the plan (sizes for the H200, or tiny ones for the CPU smoke
test), the targets the parts are judged by, the engine config overrides, a part's result and table
row, and the staging of the tokenizer for the GPU machine.

Targets (issue 5): (b) <= 3.9 ms per token at batch 1 (floor ~3.40 ms), (c) >= 9,000 tok/s at
batch 64 and ~1k context, (d) stream / non-stream >= 0.99. Correctness is judged on the CPU too;
speed targets only on CUDA (the smoke run reports its numbers as INFO).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rillet.core.model.arch import ModelArch
from rillet.core.model.shapes import SHAPES

B_TARGET_MS = 3.9
C_TARGET_TOK_S = 9000.0
D_TARGET_RATIO = 0.99
README_COPY_TB_S = 4.26  # ../shared/gpu/README.md, used only when this run's own measurement failed
TIE_TOL = 0.1  # nats: a graphs-vs-eager divergence at a near-tie of eager's top tokens is tolerated
LOGPROB_TOL = 0.25  # nats: chosen-token logprobs over the common prefix
LOGITS_FLOOR = 1e-2  # relative error always accepted (bf16 operands land between 1e-3 and 1e-2)

# ---- time (GPU) ------------------------------------------------------------------------------------
# The budget counts from the start of the device command (run.sh exports GPU_RUN_START), so the
# kit's install and the imports are inside it: budget + watchdog grace + EXIT_S <= DEVICE_LIMIT_S.
DEVICE_LIMIT_S = 420  # timeout_s of the one device call (bench/gpu/GPU.md)
EXIT_S = 25  # after the watchdog fires: table, JSON, flashinfer's log copied into $OUT
SETUP_S = 45  # estimate until measured there: install.sh, the import check, imports before parts
GRACE_S = 15.0  # the watchdog fires this long past the budget (a part that overran)
# Parts in the order they run: those that answer the targets first, on one 7B engine; then the
# logits comparisons; the default shape's greedy check (a second compile) last. A part is not
# started when less than its expected seconds (`need_s`) is left; the first six fit the budget
# after SETUP_S even at these estimates, the last three run on what the first ones did not use.
#   (name, --only key, need_s)
PARTS: tuple[tuple[str, str, float], ...] = (
    ("copy bandwidth", "bw", 15),  # with flashinfer's import (~7 s)
    ("build 7B engine", "build", 100),  # two Inductor compiles and the captures: 44-65 s on 12-04
    ("(b) batch-1 decode", "b", 25),
    ("(c) batch-64 decode", "c", 40),
    ("(d) stream vs non-stream", "d", 100),  # chat at c = 1, 8, 64, the others at 1, 8: 61 s at 3 runs
    ("(a) greedy 7B", "greedy7b", 40),  # builds an eager 7B engine beside the graphed one
    ("(e) verify step", "spec", 45),  # speculative decoding: verify vs decode forward, k = 1..8
    ("(g) spec speed 7B", "spec", 120),  # a 7B engine with n-gram drafts: verify graphs compiled
    ("(f) spec engine", "specengine", 90),  # the default shape with n-gram drafts vs eager, tokens
    ("(a) logits 7B", "logits", 40),
    ("(a) logits default", "logits", 20),
    ("(a) greedy default", "greedy", 90),  # compiles the default shape's buckets
)
TARGET_PARTS = 6  # the first six answer (b), (c), (d) and graphs-vs-eager on the 7B shape
NEED_S = {name: need for name, _, need in PARTS}


@dataclass
class Part:
    data: dict[str, Any]
    rows: list[dict[str, Any]]
    value: Any = None


def row(
    part: str, measured: str = "", target: str = "", ref: str = "", verdict: str = "INFO", note: str = ""
) -> dict[str, Any]:
    return {
        "part": part,
        "measured": measured,
        "target": target,
        "floor / ref": ref,
        "verdict": verdict,
        "note": note,
    }


def verdict(ok: bool, judged: bool = True) -> str:
    return ("PASS" if ok else "FAIL") if judged else "INFO"


@dataclass(frozen=True)
class Plan:
    device: str  # cuda | cpu
    dtype: str  # engine dtype
    attention: str  # flashinfer | torch (explicit: a silent fallback would measure the wrong thing)
    prefill_kernels: str  # flashinfer's prefill kernels (attention.flashinfer_prefill_backend)
    big_shape: str
    small_shape: str
    big_arch: ModelArch  # the architectures compared with transformers
    small_arch: ModelArch
    big_buckets: tuple[int, ...]
    small_buckets: tuple[int, ...]
    max_num_seqs: int
    big_blocks: int
    small_blocks: int
    max_model_len: int
    bw_bytes: int
    logit_prompt: int
    logit_decode: int
    greedy_lens: tuple[int, ...]
    greedy_max_tokens: tuple[int, ...]
    b_context: int
    b_prompt: int
    b_new: int
    c_rows: int
    c_context: int
    c_new: int
    iters: int
    warmup: int
    d_concurrency: tuple[int, ...]
    d_runs: int
    d_max_tokens: int
    budget_s: float
    grace_s: float
    scale: float  # multiplies every part's expected seconds (0 on the CPU: nothing is skipped)
    judged: bool = field(default=True)
    d_apis: tuple[str, ...] = ("responses", "messages")  # issue 34's endpoints, after chat
    d_api_concurrency: tuple[int, ...] = (1, 8)

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


def make_plan(cpu_smoke: bool, budget_s: float | None) -> Plan:
    if not cpu_smoke:
        return Plan(
            "cuda", "bfloat16", "flashinfer", "fa2", "mistral-7b", "smollm2-135m",
            SHAPES["mistral-7b"], SHAPES["smollm2-135m"],
            big_buckets=(1, 2, 4, 8, 16, 32, 64), small_buckets=(2, 4),  # (2, 4): one compile
            max_num_seqs=64, big_blocks=6144, small_blocks=512, max_model_len=4096,
            bw_bytes=2 << 30, logit_prompt=128, logit_decode=8,
            greedy_lens=(5, 40, 130, 300), greedy_max_tokens=(32, 24, 16, 8),  # batch 4, 3, 2, 1
            b_context=256, b_prompt=128, b_new=128, c_rows=64, c_context=1024, c_new=64,
            iters=30, warmup=5, d_concurrency=(1, 8, 64), d_runs=5, d_max_tokens=128,
            budget_s=budget_s or float(DEVICE_LIMIT_S - GRACE_S - EXIT_S), grace_s=GRACE_S, scale=1.0,
        )  # fmt: skip
    tiny = SHAPES["tiny"]
    return Plan(
        "cpu", "float32", "torch", "fa2", "tiny", "tiny",
        dataclasses.replace(tiny, architecture="mistral"),
        dataclasses.replace(tiny, tie_word_embeddings=True),
        big_buckets=(1, 2, 4, 8), small_buckets=(2, 4), max_num_seqs=8, big_blocks=256, small_blocks=128,
        max_model_len=512, bw_bytes=16 << 20, logit_prompt=24, logit_decode=4,
        greedy_lens=(5, 12, 20), greedy_max_tokens=(5, 3, 2), b_context=32, b_prompt=16, b_new=3,
        c_rows=4, c_context=32, c_new=3, iters=3, warmup=1, d_concurrency=(1, 2), d_runs=1, d_max_tokens=4,
        budget_s=budget_s or 120.0, grace_s=30.0, scale=0.0, judged=False,
    )  # fmt: skip


def overrides(
    p: Plan, shape: str, graphs: bool, buckets: tuple[int, ...], blocks: int, compile_mode: str = "default"
) -> list[str]:
    return [
        "model.kind=shape",
        f"model.shape={shape}",
        f"model.device={p.device}",
        f"model.dtype={p.dtype}",
        f"model.max_model_len={p.max_model_len}",
        # quoted: YAML reads a bare on / off as a boolean
        f"graphs.enabled='{'on' if graphs and p.device == 'cuda' else 'off'}'",
        f"graphs.buckets=[{', '.join(map(str, buckets))}]",
        f"graphs.compile_mode={compile_mode}",
        f"attention.backend={p.attention}",
        f"attention.flashinfer_prefill_backend={p.prefill_kernels}",
        f"cache.num_blocks={blocks}",
        f"scheduler.max_num_seqs={p.max_num_seqs}",
    ]


def free_memory(p: Plan) -> None:
    gc.collect()
    if p.device == "cuda":
        import torch

        torch.cuda.empty_cache()


# ---- staging (runs here, on the CPU machine) ------------------------------------------------------


def write_tokenizer_gguf(dst: Path) -> int:
    """The default model's GGUF cut to its header and metadata (tokenizer, chat template), no tensors:
    ~2 MB instead of 98 MB, so shape models can load their tokenizer on the GPU machine."""
    import numpy as np
    from rillet.core.loaders.default_model import default_model_path
    from rillet.core.loaders.gguf_file import _Cursor

    data = np.memmap(default_model_path(), dtype=np.uint8, mode="r").view(np.ndarray)
    cur = _Cursor(data)
    cur.pos = 4
    version, _, n_kv = cur.scalar(4), cur.scalar(10), cur.scalar(10)
    start = cur.pos
    for _ in range(n_kv):
        cur.string()
        cur.value(cur.scalar(4))
    blob = b"GGUF" + struct.pack("<IQQ", version, 0, n_kv) + bytes(data[start : cur.pos])
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(blob)
    return len(blob)
