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


def test_every_declared_patch_is_applied():
    """A patch declared in the package but left out of `register()` would be dead code (a patch class)
    or refuse to act (a scoped swap, an env switch): every one must be applied."""
    import pkgutil

    from vllm.platforms import current_platform

    import vllm_adaptivespec.engine as engine
    from vllm_adaptivespec.engine import plugin
    from vllm_adaptivespec.engine.patching import EnvSwitch, ScopedSwap, VllmPatch

    plugin.register()
    declared = []
    for info in pkgutil.iter_modules(engine.__path__):
        try:
            module = importlib.import_module(f"{engine.__name__}.{info.name}")
        except ImportError:  # tree_attention_cuda needs flash-attn (it declares no patch)
            continue
        for value in vars(module).values():
            for item in value if isinstance(value, tuple) else (value,):
                # XPatch(VllmPatch[X]): neither the base nor the VllmPatch[X] between them
                named_patch = isinstance(item, type) and issubclass(item, VllmPatch) and VllmPatch not in item.__bases__
                if named_patch and item is not VllmPatch and item.__module__ == module.__name__:
                    declared.append((item.__qualname__, "stock" in vars(item), module.__name__))
                elif isinstance(item, (ScopedSwap, EnvSwitch)):
                    declared.append((repr(item), item.is_applied, module.__name__))
    cpu_only = "vllm_adaptivespec.engine.cpu_fixes"  # applied on CPU only
    assert len(declared) >= 10
    assert [name for name, ok, where in declared if not ok and (current_platform.is_cpu() or where != cpu_only)] == []


def test_the_cpu_seed_fix_still_meets_the_rewind_it_replaces():
    """`cpu_fixes.SeededDiscardPatch` exists because vLLM rewinds a discarded draw with a CUDA-only
    generator offset, and works because the sampler reads the batch's own generator dict: when either
    changes, the patch must be revisited (dropped if vLLM fixed the rewind)."""
    from vllm.v1.worker import gpu_input_batch, gpu_model_runner

    bookkeeping = inspect.getsource(gpu_model_runner.GPUModelRunner._bookkeeping_sync)
    assert "gen.set_offset(gen.get_offset() - 4)" in bookkeeping and "discard_request_mask" in bookkeeping
    assert "generators=self.generators," in inspect.getsource(gpu_input_batch.InputBatch._make_sampling_metadata)


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
