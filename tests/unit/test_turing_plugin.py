"""t4serve.turing.plugin: vLLM's general plugin does nothing unless the plan put `turing-mma` in vLLM's environment
(it imports neither vLLM nor Triton then). Installing the path inside vLLM is tests/image/test_turing_attention.py's."""

from __future__ import annotations

import sys

import pytest

from t4serve.turing import plugin


@pytest.mark.parametrize("value", [None, "", "triton", "auto", "something-else"])
def test_anything_but_turing_mma_leaves_vllm_alone(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(plugin.VARIABLE, raising=False)
    else:
        monkeypatch.setenv(plugin.VARIABLE, value)
    monkeypatch.delitem(sys.modules, plugin.TARGET_MODULE, raising=False)
    plugin.register()
    assert plugin.TARGET_MODULE not in sys.modules and "triton" not in sys.modules


def test_the_entry_point_vllm_loads_is_this_register() -> None:
    from importlib.metadata import entry_points

    found = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert found.get("t4serve_turing_attention") == "t4serve.turing.plugin:register"
