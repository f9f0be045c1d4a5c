"""The contract with vLLM (patches/contract.json) still holds, and the plugin refuses other versions."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest

CONTRACT = json.loads((Path(__file__).parents[2] / "patches" / "contract.json").read_text())


def _resolve_original(dotted: str):
    """The vLLM object at `dotted` as vLLM defines it (before any AdaptiveSpec patch)."""
    from vllm_adaptivespec.engine.patching import original

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            owner = getattr(owner, name)
        return original(owner, parts[-1])
    raise ImportError(dotted)


def test_installed_vllm_is_the_pinned_version():
    import vllm

    from vllm_adaptivespec.engine.compat import SUPPORTED_VLLM

    assert CONTRACT["vllm_version"] == SUPPORTED_VLLM == vllm.__version__.split("+")[0]


def test_plugin_patches_exactly_the_contract():
    """Also: the API-server patches wait until vLLM imports the OpenAI handlers (other processes never
    import them), then apply when they are imported."""
    import sys

    from vllm_adaptivespec.engine import frontend_hooks, plugin
    from vllm_adaptivespec.engine.patching import applied_patches

    from vllm.platforms import current_platform

    plugin.register()
    expected = CONTRACT["patched"] + (CONTRACT["patched_on_cpu"] if current_platform.is_cpu() else [])
    handlers = {f"{cls}.{method}": module for module, cls, method in frontend_hooks.OPENAI_HANDLERS}
    assert sorted(handlers) == sorted(CONTRACT["patched_in_api_server"])
    imported = [name for name, module in handlers.items() if module in sys.modules]
    assert sorted(f"{p.owner}.{p.name}" for p in applied_patches()) == sorted(expected + imported)
    for module in handlers.values():
        importlib.import_module(module)
    assert sorted(f"{p.owner}.{p.name}" for p in applied_patches()) == sorted(expected + list(handlers))


@pytest.mark.parametrize("dotted, params", sorted(CONTRACT["signatures"].items()))
def test_wrapped_symbols_keep_their_signature(dotted, params):
    target = _resolve_original(dotted)
    assert list(inspect.signature(target).parameters)[: len(params)] == params


def test_unsupported_vllm_refuses_adaptivespec_with_a_clear_message(monkeypatch):
    import vllm

    from vllm_adaptivespec.engine import compat

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    assert not compat.vllm_version_supported()
    with pytest.raises(compat.UnsupportedVLLMVersion, match=r"only supports vLLM 0\.32\.0 and vLLM 0\.33\.0"):
        compat.require_supported_vllm()
