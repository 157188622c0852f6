"""The start-up check of deterministic mode, on the loaded model at the process's thread count.

The invariance of MKL's kernels is measured, not promised (it follows the CPU, the MKL build and
the thread count), so before serving, one random 40-token sequence runs through the model twice in
a scratch KV pool: as one fresh prompt alone, and in chunks of 13, 13 and 11 tokens next to another
sequence's prefill and decodes, then token by token as a decode row among others. Its last four
positions must give bit-identical logits both ways; otherwise the mode is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.model.decoder import DecoderModel, KVCache, allocate_kv_cache

LENGTH, CHUNKS, CHECKED = 40, (13, 13, 11), 4  # chunks end at the first checked position
OTHER = 23


@dataclass
class _Seq:
    tokens: list[int]
    blocks: list[int]
    done: int = 0


def _step(
    model: DecoderModel, kv: list[KVCache], bs: int, work: list[tuple[_Seq, int]]
) -> list[torch.Tensor]:
    """work: (sequence, tokens to run), prefills first -> per sequence the logits of its rows."""
    ids, pos, slots, qlens, slens, tables = [], [], [], [], [], []
    for s, n in work:
        for p in range(s.done, s.done + n):
            ids.append(s.tokens[p])
            pos.append(p)
            slots.append(s.blocks[p // bs] * bs + p % bs)
        qlens.append(n)
        slens.append(s.done + n)
        tables.append(s.blocks[: -(-(s.done + n) // bs)])
    width = max(len(t) for t in tables)
    device = model.embed_tokens.device
    meta = AttentionMetadata(
        torch.tensor(slots, device=device),
        torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32, device=device),
        torch.tensor(slens, dtype=torch.int32, device=device),
        torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device),
        qlens,
        slens,
        bs,
        sum(1 for s, n in work if n > 1 or s.done == 0),
    )
    with torch.inference_mode():
        hidden = model(torch.tensor(ids, device=device), torch.tensor(pos, device=device), kv, meta)
        logits = model.compute_logits(hidden).cpu()
    for s, n in work:
        s.done += n
    return list(logits.split(qlens))


def self_test(model: DecoderModel, block_size: int) -> str | None:
    """None when both ways agree bit for bit, else what differed."""
    arch, bs = model.arch, block_size
    gen = torch.Generator().manual_seed(0)
    vocab = arch.vocab_size

    def tokens(n: int) -> list[int]:
        return [int(t) for t in torch.randint(0, vocab, (n,), generator=gen)]

    per_seq = -(-(LENGTH + CHECKED) // bs)
    kv = allocate_kv_cache(arch, 1 + 4 * per_seq, bs, model.embed_tokens.dtype, model.embed_tokens.device)
    blocks = iter(range(1, 1 + 4 * per_seq))

    def seq(toks: list[int]) -> _Seq:
        return _Seq(toks, [next(blocks) for _ in range(per_seq)])

    text = tokens(LENGTH)
    alone = _step(model, kv, bs, [(seq(text), LENGTH)])[0][-CHECKED:]
    mine, other, third = seq(text), seq(tokens(OTHER + 1 + CHECKED)), seq(tokens(LENGTH))
    _step(model, kv, bs, [(other, OTHER), (mine, CHUNKS[0])])
    _step(model, kv, bs, [(mine, CHUNKS[1]), (third, 7), (other, 1)])
    rows = [_step(model, kv, bs, [(third, 9), (mine, CHUNKS[2])])[1][-1]]
    while mine.done < LENGTH:
        rows.append(_step(model, kv, bs, [(other, 1), (mine, 1)])[1][0])
    batched = torch.stack(rows)
    if torch.equal(alone, batched):
        return None
    diff = (alone - batched).abs().max().item()
    return f"a token's logits differed by up to {diff:.2e} between a lone prompt and chunked/batched steps"
