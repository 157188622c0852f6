"""engine.overlap: the engine launches step N+1 before it post-processes step N.

The pipelined step (EngineCore.step with overlap on):
  schedule N+1 -> launch N+1 (a decode's input is the token N sampled, read from the runner's
  future buffer on the device) -> wait for N's tokens (the step's one device->host copy, which lands
  while N+1 runs) -> detokenize, stop checks, finish, publish N.
So the host's work on a step hides under the device's work on the next. A sequence that stopped at
N (EOS, stop string, abort) was already launched in N+1; that extra token is discarded when N+1
lands (the sequence is finished by then and its blocks are back in the pool: launches run in
order, so the device writes that last K/V before any later step can reuse the blocks). max_tokens is
known ahead, so a sequence whose pending token is its last is not scheduled again.

Depth (engine.overlap_depth, D steps left in flight after a step; 1 above): with 2, the step
launches N+2 and then lands N, so while the host lands N, publishes it and schedules the next
step, the device runs N+1 with N+2 queued behind it: the next launch has two steps' time to
arrive instead of one, and host work delayed by the GIL (the event loop's writes at high
concurrency: bench/RESULTS.md) idles no device. Each decode's input is still the token the
previous launch sampled, on the device; a sequence holds up to D pending tokens, and a stop is
seen D launches late (D discarded tokens). A step that launches nothing lands the oldest in flight.
On CUDA with flashinfer, each plan() stages its schedule in pinned memory whose copy to the device
is queued, not awaited; the buffers rotate (attention/plan_staging.py), so the launch of N+2 does
not wait for N+1's copy either: no launch blocks on the device.

Synchronous fallback: a sequence whose sampling reads its own previous token ids on the host cannot
run with a token in flight: penalties read the output history, and a grammar mask must
advance its matcher with the previous token before it masks the next. `needs_host_tokens` says
which; while such a sequence is live, the engine lands the steps in flight before it schedules the
next one, so those steps run synchronously (other requests lose the overlap meanwhile, never
correctness).
"""

from __future__ import annotations

from rillet.core.sequence import Seq


def needs_host_tokens(seq: Seq) -> bool:
    """True when the sequence's next sampling needs its previous tokens on the host."""
    return seq.params.has_penalties or seq.grammar is not None


def resolve_overlap(mode: str, device_type: str, kind: str, synthetic_async: bool) -> tuple[bool, str]:
    """engine.overlap -> (on?, why), for the start-up log."""
    if mode in ("on", "off"):
        return mode == "on", f"{mode} (engine.overlap: {mode})"
    if kind == "synthetic":
        if synthetic_async:
            return True, "on (auto: asynchronous null engine)"
        return False, "off (auto: synchronous null engine, a launch blocks for the whole step)"
    if device_type == "cuda":
        return True, "on (auto: CUDA)"
    return False, (
        "off (auto: CPU model; torch runs the step on the engine thread, and a worker thread "
        "measured no faster, see bench/RESULTS.md)"
    )
