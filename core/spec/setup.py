"""From the `speculative` config section to the engine's Speculator (or None when off)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rillet.core.config import RilletConfig
from rillet.core.quant import rows_kernel
from rillet.core.spec.drafter import Drafter
from rillet.core.spec.ngram import NgramDrafter
from rillet.core.spec.speculator import Speculator

if TYPE_CHECKING:
    import torch
    from rillet.core.model.decoder import DecoderModel
    from rillet.core.tokenizer.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def build_speculator(
    cfg: RilletConfig,
    target: DecoderModel | None,
    eos: tuple[int, ...],
    max_model_len: int,
    device: torch.device,
    dtype: torch.dtype,
    num_blocks: int = 0,
    tokenizer: Tokenizer | None = None,
) -> Speculator | None:
    """`target`: the served model (None: the null engine, which never speculates); `num_blocks`
    and `tokenizer`: the target's KV pool size and tokenizer (the draft model's are checked
    against them)."""
    sc = cfg.speculative
    if not sc.enabled:
        return None
    if target is None:
        log.info("speculative decoding: off (the synthetic model has nothing to verify)")
        return None
    drafter: Drafter
    if sc.method == "ngram":
        drafter = NgramDrafter(sc.ngram_min, sc.ngram_max)
        what = f"ngram {sc.ngram_min}..{sc.ngram_max}"
    else:
        from rillet.core.spec.draft_model import load_draft_drafter

        assert tokenizer is not None
        drafter = load_draft_drafter(cfg, target, device, dtype, num_blocks, tokenizer)
        what = f"draft model {sc.draft_model}"
    log.info(
        "speculative decoding: %s, up to %d tokens a step, while <= %d sequences run",
        what,
        sc.num_tokens,
        sc.max_batch,
    )
    return Speculator(sc, drafter, max_model_len, eos, device.type, verify_rows_cheap(target))


def verify_rows_cheap(target: DecoderModel) -> bool:
    """Whether a verify step's extra query rows cost little on CPU (speculative.row_cost's default):
    float weights, or int4 ones through rillet's kernel on AMX tiles; not int4 products per row
    (its AVX512-BF16 path, torch's kernel)."""
    if not target.int4_weights:
        return True
    return target.int4_rows_kernel and rows_kernel.has_amx()
