"""A step's sampled tokens on their way to the host: device tensors, one async copy, host lists.

`Sampler.sample_device` leaves its result on the device (`DeviceSample`): the token ids, and when a
row asked for logprobs, everything the host needs packed into one float64 tensor. `start_copy()`
queues the one device->host copy of the step (into pinned memory, with an event on CUDA) and
returns at once; `HostSample.wait()` blocks until the copy has landed and unpacks it. So the engine
can launch step N+1 before it reads step N's tokens (engine.overlap), and the synchronous path is
just `start_copy().wait()`.

Packed layout (B rows, L of them with logprobs, N = the largest top-N asked):
  [tokens (B) | chosen logprob (L) | top values (L x N) | top ids (L x N)], all float64
(ids are exact in float64 up to 2**53).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rillet.core.runner.base import SampleResult
from rillet.core.sequence import Seq, TokenLogprob


@dataclass(frozen=True, slots=True)
class LogprobLayout:
    rows: list[int]  # batch rows that asked for logprobs, ascending
    want: list[int]  # per such row: how many top entries it asked for
    top_n: int  # entries packed per row (max of want)


@dataclass(slots=True)
class DeviceSample:
    tokens: torch.Tensor  # [B] int64 on the device
    packed: torch.Tensor | None = None  # float64, the layout above; None = no row wants logprobs
    layout: LogprobLayout | None = None

    def start_copy(self, timing: bool = False) -> HostSample:
        """Queues the device->host copy of what the host needs; does not wait for it. `timing`:
        its event can be timed (device_timeline.py)."""
        src = self.tokens if self.packed is None else self.packed
        if src.device.type != "cuda":
            return HostSample(src, None, len(self.tokens), self.layout)
        host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        host.copy_(src, non_blocking=True)
        done = torch.cuda.Event(enable_timing=timing)
        done.record()
        return HostSample(host, done, len(self.tokens), self.layout)


@dataclass(slots=True)
class HostSample:
    data: torch.Tensor  # on the host (pinned on CUDA) once `done` has fired
    done: torch.cuda.Event | None
    batch: int
    layout: LogprobLayout | None

    def wait(self) -> SampleResult:
        if self.done is not None:
            self.done.synchronize()  # releases the GIL while the device works
        flat = self.data.tolist()
        if self.layout is None:
            return SampleResult(flat, [None] * self.batch)
        return unpack_logprobs(flat, self.batch, self.layout)


def pack_logprobs(
    tokens: torch.Tensor,  # [B] long
    logprobs: torch.Tensor,  # [L, V] float32: log_softmax of the rows in lp_rows
    lp_rows: list[int],
    seqs: list[Seq],
    index: torch.Tensor,  # [L] long on the device: lp_rows
) -> DeviceSample:
    want = [seqs[i].params.logprobs or 0 for i in lp_rows]
    top_n = max(want)
    chosen = logprobs.gather(1, tokens[index][:, None])  # [L, 1]
    top_vals, top_ids = logprobs.topk(top_n, dim=-1)  # [L, N], best first
    parts = [tokens, chosen.flatten(), top_vals.flatten(), top_ids.flatten()]
    packed = torch.cat([p.to(torch.float64) for p in parts])
    return DeviceSample(tokens, packed, LogprobLayout(lp_rows, want, top_n))


def unpack_logprobs(flat: list[float], batch: int, layout: LogprobLayout) -> SampleResult:
    n_rows, top_n = len(layout.rows), layout.top_n
    token_ids = [int(t) for t in flat[:batch]]
    chosen_lp = flat[batch : batch + n_rows]
    vals_start = batch + n_rows
    ids_start = vals_start + n_rows * top_n
    out: list[TokenLogprob | None] = [None] * batch
    for j, (row, want) in enumerate(zip(layout.rows, layout.want, strict=True)):
        base = j * top_n
        top = [(int(flat[ids_start + base + k]), flat[vals_start + base + k]) for k in range(want)]
        out[row] = TokenLogprob(token_ids[row], chosen_lp[j], top)
    return SampleResult(token_ids, out)
