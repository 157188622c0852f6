"""How close the default CPU numerics stay to float32: greedy answers to a fixed set of chat prompts.

For each prompt of tests/data/chat_prompts.json (chat template applied, greedy, `--tokens` new
tokens, EOS honoured) it compares the first `--match` generated tokens of:
  - rillet's default config (int4 weights, bf16 matmul operands, everything else float32) against
    rillet in float32 with no quantization;
  - transformers in bfloat16 against transformers in float32, on the same weights (dequantized from
    the same GGUF by rillet's loader, so no 15 s transformers GGUF conversion), batched with left
    padding, both runs padded alike.
A prompt agrees when the two token lists are equal (a shorter answer must be equal in full). The
France answer of each run is kept, since "Paris" is what a user of the default server must get.

    .venv/bin/python bench/numerics_agreement.py [--tokens 32] [--match 16] [--skip-hf]
        [--variant cache.dtype=int8 ...]

`--variant A=x,B=y`: one more run of the default config with these overrides (e.g. an int8 KV
pool), measured against the same float32 and transformers runs ("variants" in the JSON).

tests/core/test_numerics.py runs this script in subprocesses under several CPU-ISA caps
(ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA), so one machine exercises more than one kernel path.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.loaders.default_model import default_model_path
from rillet.core.loaders.gguf import load_gguf
from rillet.core.model.decoder import DecoderModel, allocate_kv_cache
from rillet.core.sampling_params import SamplingParams

from bench.lib.common import REPO, decode_path, hf_config_kwargs, peak_rss_mib, table, write_json

PROMPTS = REPO / "tests" / "data" / "chat_prompts.json"
FRANCE = "What is the capital of France?"


def chat_prompts() -> list[str]:
    return list(json.loads(PROMPTS.read_text()))


@dataclass
class RilletRun:
    prompt_ids: list[list[int]]
    answers: list[list[int]]  # greedy answer ids per prompt
    texts: list[str]  # the answers decoded
    weights: str  # as run: "quantization/dtype"
    decode: str  # the decode step the answers came from: "compiled" | "eager"
    logits: list[torch.Tensor]  # [T, V] per forced sequence
    eos: int


def rillet_run(
    prompts: list[str],
    tokens: int,
    overrides: list[str],
    forced: list[list[int]] | None = None,
    answer: list[int] | None = None,
) -> RilletRun:
    """Greedy answers (to the prompts at the indices `answer`, by default to all), and the logits
    of a prefill of each `forced` sequence (by default each prompt followed by this run's own
    answer) at the rows that predict its answer: the prompt's rows are never compared."""
    cfg = config_from_dict({"model": {"device": "cpu"}, "cache": {"num_blocks": 512}}, overrides)
    with LLM(cfg) as llm:
        path = decode_path(llm)  # the answers come from the decode step that serves, not a mix
        rt = llm.engine.runtime
        texts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
        ids = [llm.tokenizer.encode(t) for t in texts]
        asked = [texts[i] for i in answer] if answer is not None else texts
        outs = llm.generate(asked, SamplingParams(max_tokens=tokens, temperature=0.0))
        answers = [list(o.outputs[0].token_ids) for o in outs]
        model = llm.engine.core.runner.model  # type: ignore[attr-defined]
        kv_dtype = llm.engine.core.runner.kv_caches[0].k.dtype  # type: ignore[attr-defined]
        seqs = forced or [p + a for p, a in zip(ids, answers, strict=True)]
        keep = [len(f) - len(p) + 1 for f, p in zip(seqs, ids, strict=True)]
        return RilletRun(
            ids,
            answers,
            [o.outputs[0].text for o in outs],
            f"{rt.quantization}/{str(rt.dtype).removeprefix('torch.')}",
            path,
            [prefill_logits(model, f, kv_dtype=kv_dtype, last=k) for f, k in zip(seqs, keep, strict=True)],
            rt.arch.eos_token_ids[0],
        )


def prefill_logits(
    model: DecoderModel,
    ids: list[int],
    block: int = 16,
    kv_dtype: torch.dtype | None = None,
    last: int | None = None,
) -> torch.Tensor:  # [T, V], or [last, V]
    """One whole-sequence prefill through rillet's model (blocks 1.., block 0 is the dummy), over a
    pool of the run's cache.dtype (`kv_dtype`; None: the model's dtype); the logits of the `last`
    rows only if given (the LM head over a 49152-token vocabulary is most of a prompt row's cost)."""
    nblk = -(-len(ids) // block)
    kv = allocate_kv_cache(model.arch, nblk + 1, block, kv_dtype or model.embed_tokens.dtype, "cpu")
    n = len(ids)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(block, block + n),
        query_start=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_tables=torch.arange(1, nblk + 1, dtype=torch.int32)[None],
        query_lens_cpu=[n],
        seq_lens_cpu=[n],
        block_size=block,
        num_prefills=1,
    )
    with torch.inference_mode():
        model.backend.begin_step(meta)
        hidden = model(torch.tensor(ids), torch.arange(n), kv, meta)
        return model.compute_logits(hidden if last is None else hidden[-last:])


def forced_stats(
    logits: list[torch.Tensor], ref: list[torch.Tensor], answers: list[list[int]]
) -> dict[str, float]:
    """Teacher forcing along the float32 answers: share of answer positions whose argmax is the
    float32 token, and the mean absolute logit error there (a smoother measure than whole-answer
    equality, which one early flip decides). Each logits tensor ends with the rows that predict
    its answer (it may hold no prompt rows before them)."""
    hits = total = 0
    err = 0.0
    for lg, rf, ans in zip(logits, ref, answers, strict=True):
        pos = slice(lg.shape[0] - len(ans) - 1, lg.shape[0] - 1)  # rows predicting the answer tokens
        hits += int((lg[pos].argmax(-1) == torch.tensor(ans)).sum())
        total += len(ans)
        err += float((lg[pos] - rf[pos]).abs().mean()) * len(ans)
    return {"argmax_agree": hits / total, "mean_abs_logit_err": err / total}


def hf_model(dtype: torch.dtype = torch.float32) -> Any:
    """transformers' Llama on the default GGUF's weights (dequantized by rillet's loader)."""
    import transformers

    arch, weights = load_gguf(default_model_path(), torch.float32)
    config = transformers.LlamaConfig(
        **hf_config_kwargs(arch),
    )
    model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(dict(weights), strict=False)  # lm_head: tied to the embedding
    return model.to(dtype).eval()


def hf_run(
    model: Any, prompt_ids: list[list[int]], tokens: int, eos: int, forced: list[list[int]]
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy answers (batched, left-padded) and the float32 logits of each `forced` sequence at
    the rows that predict its answer (as rillet_run keeps them)."""
    width = max(map(len, prompt_ids))
    ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    with torch.inference_mode():
        logits = [
            model(torch.tensor([f]), logits_to_keep=len(f) - len(p) + 1).logits[0].float()
            for f, p in zip(forced, prompt_ids, strict=True)
        ]
        if tokens == 0:
            return [], logits
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False, pad_token_id=eos
        )
    answers = []
    for row in out[:, width:].tolist():
        answers.append(row[: row.index(eos) + 1] if eos in row else row)
    return answers, logits


def agreement(a: list[list[int]], b: list[list[int]], match: int) -> float:
    return sum(x[:match] == y[:match] for x, y in zip(a, b, strict=True)) / len(a)


def measure(
    tokens: int,
    match: int,
    skip_hf: bool,
    default_set: list[str],
    prompts_n: int | None = None,
    quick: bool = False,
    variants: tuple[str, ...] = (),
) -> dict[str, Any]:
    """`quick`, for the test suite: transformers only under teacher forcing (no generate), and the
    runs compared to float32 answer the France prompt only (their other answers would feed the
    whole-answer agreement alone, which quick does not report)."""
    prompts = chat_prompts()[:prompts_n]
    t0 = time.perf_counter()
    # the reference is the plainest path: float32 weights, eager decode
    reference = ["model.quantization=none", "model.dtype=float32", "graphs.enabled=off"]
    fp32 = rillet_run(prompts, tokens, reference)
    forced = [p + a for p, a in zip(fp32.prompt_ids, fp32.answers, strict=True)]
    f = prompts.index(FRANCE)
    answer = [f] if quick else None
    default = rillet_run(prompts, tokens, default_set, forced, answer)
    fa = 0 if quick else f  # the France answer's index among a compared run's answers
    result: dict[str, Any] = {
        "prompts": len(prompts),
        "tokens": tokens,
        "match": match,
        "default_set": default_set,
        "default_run": default.weights,
        "fp32_run": fp32.weights,
        "default_decode": default.decode,
        "default_vs_fp32": None if quick else agreement(default.answers, fp32.answers, match),
        "default_forced": forced_stats(default.logits, fp32.logits, fp32.answers),
        "default_disagrees_on": None
        if quick
        else [
            p
            for p, x, y in zip(prompts, default.answers, fp32.answers, strict=True)
            if x[:match] != y[:match]
        ],
        "default_france": default.texts[fa],
        "fp32_france": fp32.texts[f],
        "variants": {},
    }
    for v in variants:  # the default config with more overrides, against the same references
        run = rillet_run(prompts, tokens, [*default_set, *v.split(",")], forced, answer)
        result["variants"][v] = {
            "run": run.weights,
            "decode": run.decode,
            "vs_fp32": None if quick else agreement(run.answers, fp32.answers, match),
            "forced": forced_stats(run.logits, fp32.logits, fp32.answers),
            "france": run.texts[fa],
        }
    if not skip_hf:
        n, ids, eos = 0 if quick else tokens, fp32.prompt_ids, fp32.eos
        model = hf_model()  # one load of the weights: float32 first, then cast in place to bf16
        hf32, hlog32 = hf_run(model, ids, n, eos, forced)
        hf16, hlog16 = hf_run(model.to(torch.bfloat16), ids, n, eos, forced)
        result["hf_bf16_forced"] = forced_stats(hlog16, hlog32, fp32.answers)
        if not quick:
            result |= {
                "hf_bf16_vs_hf_fp32": agreement(hf16, hf32, match),
                "rillet_fp32_vs_hf_fp32": agreement(fp32.answers, hf32, match),
            }
    result["seconds"] = time.perf_counter() - t0
    result["isa_caps"] = {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    result["peak_rss_mib"] = peak_rss_mib()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--match", type=int, default=16)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--set", action="append", default=[], help="config override of the run compared to fp32")
    ap.add_argument("--prompts", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--quick", action="store_true", help="transformers under teacher forcing only")
    ap.add_argument("--variant", action="append", default=[], help="another run: overrides A=x,B=y")
    ap.add_argument("--out", default="bench/out/numerics_agreement.json")
    a = ap.parse_args()
    r = measure(a.tokens, a.match, a.skip_hf, a.set, a.prompts, a.quick, tuple(a.variant))
    write_json(a.out, r)
    name = "default" if not a.set else ",".join(a.set)
    rows = [
        {
            "pair": f"rillet {name} ({r['default_run']}) vs rillet {r['fp32_run']}",
            "answers_agree": r["default_vs_fp32"],
        }
        | r["default_forced"]
    ]
    for v, vr in r["variants"].items():
        pair = f"rillet {name},{v} ({vr['run']}) vs rillet {r['fp32_run']}"
        rows.append({"pair": pair, "answers_agree": vr["vs_fp32"]} | vr["forced"])
        print(f"France, {v}: {vr['france']!r}")
    if "hf_bf16_forced" in r:
        rows.append(
            {"pair": "transformers bf16 vs transformers fp32", "answers_agree": r.get("hf_bf16_vs_hf_fp32")}
            | r["hf_bf16_forced"]
        )
    if "rillet_fp32_vs_hf_fp32" in r:
        rows.append(
            {"pair": "rillet none/float32 vs transformers fp32", "answers_agree": r["rillet_fp32_vs_hf_fp32"]}
        )
    print(f"France, default: {r['default_france']!r}")
    print(table(rows, ["pair", "answers_agree", "argmax_agree", "mean_abs_logit_err"]))


if __name__ == "__main__":
    main()
