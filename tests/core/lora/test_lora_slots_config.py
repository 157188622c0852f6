"""The slot table (the scheduler's, plain Python) and the `lora` config section."""

from __future__ import annotations

from typing import Any

import pytest
from rillet.core.config import ConfigError, config_from_dict, load_config
from rillet.core.lora.adapter import LoraAdapter
from rillet.core.lora.slots import SlotTable


def _adapter(uid: int) -> LoraAdapter:
    return LoraAdapter(f"a{uid}", "-", uid, 4, 1.0, {})


def test_a_resident_adapter_is_shared_and_written_once() -> None:
    table, writes = SlotTable(2), []  # type: ignore[var-annotated]
    a = _adapter(1)
    assert table.acquire(a, writes) == 1
    assert table.acquire(a, writes) == 1
    assert writes == [(1, a)] and table.refs[1] == 2


def test_least_recently_used_idle_adapter_is_evicted() -> None:
    table, writes = SlotTable(2), []  # type: ignore[var-annotated]
    a, b, c = _adapter(1), _adapter(2), _adapter(3)
    sa, sb = table.acquire(a, writes), table.acquire(b, writes)
    assert table.acquire(c, writes) is None  # both slots held by running sequences
    assert sa is not None and sb is not None
    table.release(sa)
    table.release(sb)  # b idle last: a is the least recently used
    assert table.acquire(c, writes) == sa and not table.resident(a.uid) and table.resident(b.uid)
    assert table.acquire(b, writes) == sb  # still resident: no write
    assert writes == [(1, a), (2, b), (1, c)] and table.loads == 3


def test_release_twice_is_an_error() -> None:
    table = SlotTable(1)
    slot = table.acquire(_adapter(1), [])
    assert slot == 1
    table.release(slot)
    with pytest.raises(AssertionError):
        table.release(slot)


def test_config_section_defaults_and_yaml() -> None:
    cfg = load_config("rillet.yaml")
    assert cfg.lora == config_from_dict({}).lora and not cfg.lora.enabled
    cfg = load_config(None, ["lora.adapters={a: /x, b-2: /y}", "lora.max_loras=2"])
    assert cfg.lora.adapters == {"a": "/x", "b-2": "/y"} and cfg.lora.enabled


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("lora.max_rank=0", "lora.max_rank"),
        ("lora.max_loras=0", "lora.max_loras"),
        ("lora.adapters=[1]", "lora.adapters"),
        ('lora.adapters={"a b": /x}', "lora.adapters.a b"),
        ("lora.adapters={a: 3}", "lora.adapters.a"),
        ("lora.target_modules=[fc1]", "lora.target_modules"),
    ],
)
def test_bad_values_name_the_key(override: str, key: Any) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.key == key
