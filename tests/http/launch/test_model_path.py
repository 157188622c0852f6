"""check_model_path (http/launch/model_path.py): what `rillet serve` refuses before the port opens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rillet.core.config import ConfigError, RilletConfig, load_config
from rillet.http.launch.model_path import check_model_path


def _config(path: Path) -> RilletConfig:
    return load_config(None, [f"model.path={path}"])


def _bert_folder(root: Path, sentence_transformers: bool) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "bert"}))
    if sentence_transformers:
        (root / "modules.json").write_text("[]")
    return root


def test_bert_passes_only_as_a_sentence_transformers_folder(tmp_path: Path) -> None:
    """The families check (issue 29) let only decoder families through, so `rillet serve` refused
    every BERT embedding folder (issue 33) before it opened its port."""
    check_model_path(_config(_bert_folder(tmp_path / "st", sentence_transformers=True)))
    with pytest.raises(ConfigError, match=r"model_type 'bert' is not supported"):
        check_model_path(_config(_bert_folder(tmp_path / "plain", sentence_transformers=False)))
