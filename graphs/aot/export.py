"""A step as an AOTInductor package: exported with torch.export, compiled ahead of time.

The exported function takes the batch's tensors and the model's `step_state` (the KV pool), in
that order, flat: a package is called with a list of tensors, no Python objects. Its dimensions:
  rows    the batch's rows, from 1: export keeps a symbol that starts at 1 (dynamo's torch.compile
          specialises a size of 1, which cost the compiled step a second graph), so one package
          serves every batch size, batch 1 included
  width   the block-table columns, from 1
  blocks  the pool's block count (dim 0 of every state tensor): a package built for one
          `cache.num_blocks` or memory budget serves every other
  queries Q of a verify step, from 2 (graphs/verify.py MIN_QUERIES): a step is padded to its
          longest draft, not to 1 + speculative.num_tokens

Built like torch.compile in the same mode: the mode's Inductor options (max-autotune: Inductor's
GEMM templates, autotuned against aten's kernels) and, where the mode freezes (compiled.freezes),
the weights frozen into constants with the fingerprint pass of graphs/frozen.py.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rillet.graphs.frozen import frozen_weights
from rillet.graphs.interface import DecodeBatch, SavableModel, VerifyBatch
from rillet.graphs.verify import MIN_QUERIES
from torch import nn
from torch.export import Dim, ExportedProgram

logger = logging.getLogger(__name__)

DECODE_INPUTS = 5  # input_ids, positions, slot_mapping, seq_lens, block_tables
VERIFY_INPUTS = 6  # input_ids, positions, slot_mapping, seq_lens, query_lens, block_tables


class DecodeStep(nn.Module):
    """The decode forward over flat inputs. query_start and seq_lens_cpu are left empty: a
    graph-safe decode forward reads neither (graphs/interface.py)."""

    def __init__(self, model: SavableModel) -> None:
        super().__init__()
        self.weights = model.weights_module()  # registered: export makes its tensors constants
        self._model = model

    def forward(self, *flat: torch.Tensor) -> torch.Tensor:
        ids, pos, slots, lens, tables = flat[:DECODE_INPUTS]
        batch = DecodeBatch(ids, pos, slots, lens, tables, lens.new_empty(0), [])
        return self._model.forward_decode_with(batch, flat[DECODE_INPUTS:])


class VerifyStep(nn.Module):
    def __init__(self, model: SavableModel) -> None:
        super().__init__()
        self.weights = model.weights_module()
        self._model = model

    def forward(self, *flat: torch.Tensor) -> torch.Tensor:
        ids, pos, slots, lens, qlens, tables = flat[:VERIFY_INPUTS]
        batch = VerifyBatch(ids, pos, slots, lens, qlens, tables, [], [])
        return self._model.forward_verify_with(batch, flat[VERIFY_INPUTS:])


def decode_inputs(batch: DecodeBatch, state: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [batch.input_ids, batch.positions, batch.slot_mapping, batch.seq_lens, batch.block_tables, *state]


def verify_inputs(batch: VerifyBatch, state: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    b = batch
    return [b.input_ids, b.positions, b.slot_mapping, b.seq_lens, b.query_lens, b.block_tables, *state]


def export_decode(model: SavableModel, example: DecodeBatch) -> ExportedProgram:
    state = model.step_state()
    rows, width, blocks = _dims()
    shapes: list[dict[int, Any]] = [{0: rows}] * 4 + [{0: rows, 1: width}] + [{0: blocks}] * len(state)
    return _export(DecodeStep(model), decode_inputs(example, state), shapes)


def export_verify(model: SavableModel, example: VerifyBatch) -> ExportedProgram:
    state = model.step_state()
    rows, width, blocks = _dims()
    queries = Dim("queries", min=MIN_QUERIES)
    per_query: dict[int, Any] = {0: rows, 1: queries}  # input_ids, positions, slot_mapping: [rows, Q]
    shapes: list[dict[int, Any]] = (
        [per_query] * 3 + [{0: rows}] * 2 + [{0: rows, 1: width}] + [{0: blocks}] * len(state)
    )
    return _export(VerifyStep(model), verify_inputs(example, state), shapes)


def _dims() -> tuple[Dim, Dim, Dim]:
    return Dim("rows", min=1), Dim("width", min=1), Dim("blocks", min=2)


def _export(step: nn.Module, args: list[torch.Tensor], shapes: list[dict[int, Any]]) -> ExportedProgram:
    # non-strict: the forward runs as Python (as eager does); inference mode: no autograd in the graph
    with torch.inference_mode():
        return torch.export.export(step.eval(), tuple(args), dynamic_shapes=(tuple(shapes),), strict=False)


def build_library(
    program: ExportedProgram,
    mode: str,
    weights_key: str | None,
    out_dir: Path,
    gemm_backends: str | None = None,
) -> Path:
    """build_package, then the one shared library inside it (kernels, wrapper and constants).

    Only the library is kept: loaded directly it takes ~0.3 s for the default model, where
    aoti_load_package first unpacks the 190 MB archive to a temporary folder, every time (6 s,
    measured on a busy host)."""
    package = build_package(program, mode, weights_key, out_dir, gemm_backends)
    with zipfile.ZipFile(package) as zf:
        libs = [n for n in zf.namelist() if n.endswith(".so")]
        if len(libs) != 1:
            raise RuntimeError(f"expected one shared library in {package}, found {libs}")
        target = out_dir / "step.so"
        _extract(zf, libs[0], target)
        # the extern nodes of custom ops (rillet::int4_rows_mm): AOTInductor's runner reads them
        # from the .json beside the library, named like it, to call those ops through the dispatcher
        extern = libs[0].removesuffix(".so") + ".json"
        if extern in zf.namelist():
            _extract(zf, extern, target.with_suffix(".json"))
    package.unlink()
    return target


def _extract(zf: zipfile.ZipFile, name: str, target: Path) -> None:
    with zf.open(name) as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def build_package(
    program: ExportedProgram,
    mode: str,
    weights_key: str | None,
    out_dir: Path,
    gemm_backends: str | None = None,
) -> Path:
    """AOTInductor-compiles `program` like torch.compile in `mode` (weights frozen when
    `weights_key` is given) into a package under `out_dir`; `gemm_backends`: Inductor's
    `max_autotune_gemm_backends` (e.g. "ATEN": aten's kernels only, no GEMM templates)."""
    import torch._inductor as inductor

    options: dict[str, Any] = dict(inductor.list_mode_options(mode)) if mode != "none" else {}
    if gemm_backends is not None:
        options["max_autotune_gemm_backends"] = gemm_backends
    path = Path(tempfile.mkdtemp(prefix="build-", dir=out_dir)) / "step.pt2"
    with frozen_weights(weights_key):
        built = inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=options)
    return Path(built)
