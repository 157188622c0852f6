"""The sampler tests' rows: `seq()` (a Seq with its own sampling parameters, prompt and output
so far), the device they sample on (CPU) and the EOS id their samplers are given."""

from __future__ import annotations

from typing import Any

import torch
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq

CPU = torch.device("cpu")
EOS = 3


def seq(seq_id: int, prompt: list[int] | None = None, output: list[int] | None = None, **params: Any) -> Seq:
    s = Seq(seq_id=seq_id, request_id=f"r{seq_id}", prompt_ids=prompt or [0], params=SamplingParams(**params))
    s.output_ids = list(output or [])
    return s
