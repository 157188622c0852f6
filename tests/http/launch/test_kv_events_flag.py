"""vLLM's --kv-events-config flag (an llm-d manifest's vLLM arguments) sets the kv_events keys."""

from __future__ import annotations

import json

import pytest
from rillet.core.config import ConfigError, load_config
from rillet.http.cli import build_parser, main, overrides_from


def test_an_llmd_manifests_flag_sets_the_kv_events_keys() -> None:
    flag = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://gaie-epp:5557",
        "replay_endpoint": "tcp://*:5558",
        "topic": "kv@10.0.0.7@Qwen/Qwen3-0.6B",
        "buffer_steps": 100,
        "hwm": 1000,
        "max_queue_size": 10,
    }
    args = build_parser().parse_args(["serve", "--kv-events-config", json.dumps(flag)])
    kv = load_config(None, overrides_from(args)).kv_events
    assert kv.enabled and kv.endpoint == "tcp://gaie-epp:5557" and kv.replay_endpoint == "tcp://*:5558"
    assert kv.topic == "kv@10.0.0.7@Qwen/Qwen3-0.6B" and kv.model_in_topic() == "Qwen/Qwen3-0.6B"
    assert (kv.buffer_steps, kv.hwm, kv.max_queue_size) == (100, 1000, 10)
    off = build_parser().parse_args(["serve", "--kv-events-config", '{"publisher": "null"}'])
    assert not load_config(None, overrides_from(off)).kv_events.enabled


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("not json", "kv_events"),
        ('{"enable_kv_cache_events": true, "bogus": 1}', "kv_events.bogus"),
        ('{"endpoint": "http://x"}', "kv_events.endpoint"),
    ],
)
def test_a_bad_flag_exits_2_naming_the_key(text: str, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError):
        load_config(None, overrides_from(build_parser().parse_args(["serve", "--kv-events-config", text])))
    assert main(["serve", "--kv-events-config", text]) == 2
    assert f"'{key}'" in capsys.readouterr().err
