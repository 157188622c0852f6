"""The one config: YAML + overrides into frozen dataclasses, every error naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest
from rillet.core.config import ConfigError, RilletConfig, config_from_dict, config_to_dict, load_config


def test_defaults_and_round_trip() -> None:
    cfg = config_from_dict({})
    assert cfg == RilletConfig()
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_yaml_file_and_overrides(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("cache:\n  block_size: 32\nserver:\n  api_keys: [a, b]\n")
    cfg = load_config(p, ["scheduler.max_num_seqs=8", "graphs.buckets=[1, 2, 4]", "graphs.enabled=off"])
    assert cfg.cache.block_size == 32 and cfg.server.api_keys == ("a", "b")
    assert cfg.scheduler.max_num_seqs == 8 and cfg.graphs.buckets == (1, 2, 4)
    assert cfg.graphs.enabled == "off"  # YAML reads a bare off as False; mapped back


@pytest.mark.parametrize(
    ("data", "overrides", "key"),
    [
        ({"cache": {"blok_size": 16}}, [], "cache.blok_size"),
        ({"nope": {}}, [], "nope"),
        ({"cache": {"block_size": "big"}}, [], "cache.block_size"),
        ({"cache": {"block_size": 12}}, [], "cache.block_size"),
        ({"cache": {"dtype": "int4"}}, [], "cache.dtype"),
        ({}, ["cache.dtype=fp8"], "cache.dtype"),
        ({}, ["scheduler.max_num_seqs=0"], "scheduler.max_num_seqs"),
        ({}, ["model.dtype=float64"], "model.dtype"),
        ({}, ["attention.flashinfer_prefill_backend=fa4"], "attention.flashinfer_prefill_backend"),
        ({"attention": {"prefill_backend": "fa2"}}, [], "attention.prefill_backend"),
        ({}, ["stream.ring_capacity=1000"], "stream.ring_capacity"),
        ({}, ["stream.write_order=last"], "stream.write_order"),
        ({}, [f"stream.ring_capacity={1 << 40}"], "stream.ring_capacity"),
        ({}, ["server.port=true"], "server.port"),
        ({}, ["justakey"], "justakey"),
        ({"cache": 3}, [], "cache"),
        ({}, ["server.header_timeout_s=0"], "server.header_timeout_s"),
        ({}, ["server.body_timeout_s=-1"], "server.body_timeout_s"),
        ({}, ["server.keepalive_timeout_s=0"], "server.keepalive_timeout_s"),
        ({}, ["server.keepalive_timeout_s=null"], "server.keepalive_timeout_s"),
        ({}, ["server.max_connections=0"], "server.max_connections"),
        ({}, ["server.max_connections=1.5"], "server.max_connections"),
        ({}, ["server.over_capacity=503"], "server.over_capacity"),
        ({}, ["server.over_capacity=drop"], "server.over_capacity"),
        ({}, ["structured.repetition_penalty=0"], "structured.repetition_penalty"),
        ({}, ["server.cors_allowed_origins=[example.com]"], "server.cors_allowed_origins"),
        ({}, ["server.cors_allowed_origins=[https://a.example/app]"], "server.cors_allowed_origins"),
        ({}, ["server.cors_allowed_origins=[3]"], "server.cors_allowed_origins"),
        ({}, ["cache.memory_gb=.inf"], "cache.memory_gb"),
        ({}, ['server.host=""'], "server.host"),
        ({}, ["stream.max_delay_ms=.nan"], "stream.max_delay_ms"),
        ({}, ["server.request_timeout_s=.inf"], "server.request_timeout_s"),
        ({}, [f"cache.memory_gb={10**400}"], "cache.memory_gb"),
        ({}, ["observability.otlp_endpoint=127.0.0.1:4318"], "observability.otlp_endpoint"),
        ({}, ["observability.otlp_endpoint=http://"], "observability.otlp_endpoint"),
        ({}, ["observability.otlp_endpoint=4318"], "observability.otlp_endpoint"),
        ({}, ['observability.service_name=" "'], "observability.service_name"),
        ([1, 2], [], "<root>"),
        ("hello", [], "<root>"),
    ],
)
def test_errors_name_the_key(data: dict, overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(data, overrides)
    assert err.value.key == key
    assert key in str(err.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_unreadable_files_are_one_line_config_errors(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe model:\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary)
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: {a: [\n")
    with pytest.raises(ConfigError) as err:
        load_config(broken)
    assert "\n" not in str(err.value) and "line 2" in str(err.value)


def test_a_key_given_twice_is_refused_not_overwritten(tmp_path: Path) -> None:
    # PyYAML keeps the last: a second `server:` section silently dropped the first's api_keys
    twice = tmp_path / "twice.yaml"
    twice.write_text("server:\n  api_keys: [k]\nmodel:\n  seed: 1\nserver:\n  port: 9\n")
    with pytest.raises(ConfigError) as err:
        load_config(twice)
    assert "'server' given twice" in str(err.value) and "line 5" in str(err.value)
    with pytest.raises(ConfigError, match="'a' given twice"):
        config_from_dict({}, ["lora.adapters={a: /x, a: /y}"])
    merged = config_from_dict({}, ["lora.adapters={<<: {a: /x, b: /z}, a: /y}"])  # a merge key: no twice
    assert merged.lora.adapters == {"a": "/y", "b": "/z"}


def test_exponents_are_numbers_as_in_yaml_1_2() -> None:
    cfg = config_from_dict({}, ["server.request_timeout_s=1e3", "cache.memory_gb=5e-1"])
    assert cfg.server.request_timeout_s == 1000.0 and cfg.cache.memory_gb == 0.5  # were strings
    assert config_from_dict({}, ["server.port=8000"]).server.port == 8000  # ints stay ints
    with pytest.raises(ConfigError, match="expected int"):
        config_from_dict({}, ["server.max_body_bytes=1e9"])


def test_an_unparsable_override_is_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({}, ["server.port=[1"])
    assert err.value.key == "server.port" and "\n" not in str(err.value) and "column 3" in str(err.value)


def test_an_empty_section_takes_overrides(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("model:\n")
    assert load_config(p, ["model.path=/x"]).model.path == "/x"


def test_frozen() -> None:
    cfg = config_from_dict({})
    with pytest.raises(AttributeError):
        cfg.cache.block_size = 8  # type: ignore[misc]


def test_flashinfer_prefill_backend_is_checked_on_construction() -> None:
    from rillet.core.config import AttentionConfig

    assert AttentionConfig().flashinfer_prefill_backend == "fa2"
    with pytest.raises(ConfigError) as err:
        AttentionConfig(flashinfer_prefill_backend="fa4")  # type: ignore[arg-type]
    assert err.value.key == "attention.flashinfer_prefill_backend" and "fa2, fa3, auto" in str(err.value)


def test_more_torch_threads_than_cores_is_refused_at_load() -> None:
    """Machine-dependent, so checked where the runtime is built, before any thread is set."""
    import os

    from rillet.core.runtime import load_runtime

    cfg = config_from_dict({"model": {"kind": "synthetic", "num_threads": (os.cpu_count() or 1) + 1}})
    with pytest.raises(ConfigError) as err:
        load_runtime(cfg)
    assert err.value.key == "model.num_threads"


def test_rillet_compile_refuses_more_torch_threads_than_cores_too() -> None:
    """`rillet compile` builds steps for the config `rillet serve` would load: the same check, before any
    model is read."""
    import os

    from rillet.core.compile_ahead import compile_artifacts

    cfg = config_from_dict({"model": {"kind": "synthetic", "num_threads": (os.cpu_count() or 1) + 1}})
    with pytest.raises(ConfigError) as err:
        compile_artifacts(cfg, lambda line: None)
    assert err.value.key == "model.num_threads"


def test_a_blank_served_name_is_refused_not_taken_for_null() -> None:
    for name in ("", "  "):
        with pytest.raises(ConfigError) as err:
            config_from_dict({"model": {"served_name": name}})
        assert err.value.key == "model.served_name"
    assert config_from_dict({"model": {"served_name": "smol"}}).model.served_name == "smol"


def test_a_choice_is_matched_without_case_and_a_bad_one_is_named_as_given() -> None:
    """`logging.level: debug` is DEBUG, as the --log-level flag takes it; a bare YAML true where
    on/off is not a choice is reported as the true that was written, not as the 'on' it was read as."""
    assert config_from_dict({"logging": {"level": "debug"}}).logging.level == "DEBUG"
    with pytest.raises(ConfigError) as err:
        config_from_dict({"speculative": {"method": True}})
    assert err.value.key == "speculative.method" and "got True" in str(err.value)
