"""Tree-mode settings as resolved against vLLM's speculative config, and the debug knob."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_adaptivespec.config import AdaptiveSpecConfigError
from vllm_adaptivespec.engine.settings import debug_settings, resolve


def drafter(k: int, **extra):
    return SimpleNamespace(method="draft_model", num_speculative_tokens=k, rejection_sample_method="standard", **extra)


def test_tree_mode_takes_num_speculative_tokens_as_the_node_ceiling():
    config = resolve({"mode": "tree"}, drafter(16))
    assert config.mode == "tree" and config.max_nodes == 16 and config.max_depth == 6
    small = resolve({"mode": "tree"}, drafter(4))
    assert small.max_nodes == 4 and small.max_depth == 4


def test_tree_mode_refuses_more_nodes_than_vllm_buffers_hold():
    with pytest.raises(AdaptiveSpecConfigError, match="adaptivespec.max_nodes"):
        resolve({"mode": "tree", "max_nodes": 20}, drafter(12))
    assert resolve({"mode": "tree", "max_nodes": 8}, drafter(12)).max_nodes == 8


def test_chain_mode_keeps_its_depth_ceiling():
    config = resolve({}, drafter(5))
    assert config.mode == "chain" and config.max_depth == 5


@pytest.mark.parametrize("flag", ["use_heterogeneous_vocab", "parallel_drafting"])
def test_drafters_that_cannot_grow_trees_are_refused(flag):
    with pytest.raises(AdaptiveSpecConfigError, match=f"speculative_config.{flag}"):
        resolve({"mode": "tree"}, drafter(8, **{flag: True}))


def test_debug_knob_is_validated():
    assert debug_settings(SimpleNamespace(additional_config={"adaptivespec": {}})) == {}
    knobs = {"adaptivespec_debug": {"random_shapes": 3}}
    assert debug_settings(SimpleNamespace(additional_config=knobs)) == {"random_shapes": 3}
    for bad, named in (({"shapes": 1}, "adaptivespec_debug.shapes"), ({"random_shapes": "x"}, "random_shapes")):
        with pytest.raises(AdaptiveSpecConfigError, match=named):
            debug_settings(SimpleNamespace(additional_config={"adaptivespec_debug": bad}))


def test_cuda_runs_pin_target_and_drafter_to_the_tree_capable_backend(monkeypatch):
    import vllm.platforms

    from vllm_adaptivespec.engine.frontend_hooks import _use_tree_attention_backend

    monkeypatch.setattr(vllm.platforms, "current_platform", SimpleNamespace(is_cuda=lambda: True), raising=False)
    args = SimpleNamespace(attention_backend=None, attention_config=SimpleNamespace(backend=None),
                           speculative_config={"method": "eagle3", "model": "x"})  # fmt: skip
    _use_tree_attention_backend(args)
    assert args.attention_backend == "FLASH_ATTN"
    assert args.speculative_config["attention_backend"] == "FLASH_ATTN"
    other = SimpleNamespace(attention_backend="TRITON_ATTN", attention_config=SimpleNamespace(backend=None),
                            speculative_config={})  # fmt: skip
    with pytest.raises(AdaptiveSpecConfigError, match="attention_backend"):
        _use_tree_attention_backend(other)
    monkeypatch.setattr(vllm.platforms, "current_platform", SimpleNamespace(is_cuda=lambda: False), raising=False)
    cpu = SimpleNamespace(attention_backend=None, attention_config=SimpleNamespace(backend=None), speculative_config={})
    _use_tree_attention_backend(cpu)
    assert cpu.attention_backend is None
