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
    plain = _bert_folder(tmp_path / "plain", sentence_transformers=False)
    with pytest.raises(ConfigError, match=r"model_type 'bert' is not supported"):
        check_model_path(_config(plain))
    # a bare encoder folder embeds when asked to (cls pooling): the engine serves it, so must `rillet serve`
    check_model_path(load_config(None, [f"model.path={plain}", "model.task=embed"]))


def test_a_draft_model_is_checked_like_the_model(tmp_path: Path) -> None:
    garbage = tmp_path / "draft.gguf"
    garbage.write_bytes(b"GGUF" + b"\xff" * 60)  # the magic, then a corrupt header
    cfg = load_config(None, ["speculative.method=draft", f"speculative.draft_model={garbage}"])
    with pytest.raises(ConfigError) as err:
        check_model_path(cfg)
    assert err.value.key == "speculative.draft_model"
    off = load_config(None, ["speculative.method=off", f"speculative.draft_model={garbage}"])
    check_model_path(off)  # not loaded: not checked


def test_compile_refuses_a_bad_model_path_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rillet.http.cli import main

    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a model" * 10)
    assert main(["compile", "--set", f"model.path={garbage}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.path" in err and "Traceback" not in err
