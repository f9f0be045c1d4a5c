"""Arctic Inference (optional, built by scripts/setup.sh): its suffix decoding cache, which vLLM's ``suffix``
method imports, works from Python, and its own vLLM plugin stays inert next to ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

try:
    from arctic_inference.suffix_decoding import SuffixDecodingCache
except Exception as err:  # not installed, or its native extension does not load
    pytestmark = pytest.mark.skip(reason=f"arctic_inference is not importable ({type(err).__name__}: {err}); "
                                         "scripts/setup.sh builds it (optional step)")


def test_suffix_cache_drafts_what_the_prompt_and_earlier_responses_say_comes_next():
    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=16)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 3, 5, 6, 7]
    cache.start_request("a", prompt)
    assert "a" in cache.active_requests and "a" in cache.cached_requests
    cache.add_active_response("a", [8])
    draft = cache.speculate("a", prompt + [8], max_spec_tokens=4, max_spec_factor=1.0, min_token_prob=0.1)
    # "5 6 7 8" matched in the prompt: what followed it there is drafted, capped at max_spec_tokens
    assert draft.token_ids == [9, 10, 11, 12] and draft.match_len == 4
    assert draft.parents == [-1, 0, 1, 2] and len(draft.probs) == 4 and all(0 < p <= 1 for p in draft.probs)
    assert draft.score == pytest.approx(sum(draft.probs))
    assert cache.speculate("a", [5, 6, 7, 8], max_spec_tokens=2).token_ids == [9, 10]
    # max_spec_factor caps the draft at factor x the matched length
    assert len(cache.speculate("a", [11, 12], max_spec_tokens=8, max_spec_factor=1.0).token_ids) <= 2
    nothing = cache.speculate("a", [1000, 1001], max_spec_tokens=4)
    assert nothing.token_ids == [] and nothing.match_len == 0
    cache.add_active_response("a", [40, 41, 42, 43])
    cache.stop_request("a")
    assert "a" not in cache.active_requests and "a" in cache.cached_requests  # its response stays cached
    # A new request drafts from the cached response of the earlier one (the global tree).
    cache.start_request("b", [1, 2, 3])
    assert cache.speculate("b", [8, 40, 41], max_spec_tokens=4).token_ids[:2] == [42, 43]
    cache.stop_request("b")
    with pytest.raises(ValueError, match="not active"):
        cache.stop_request("b")
    cache.evict_cached_response("a")
    assert "a" not in cache.cached_requests


def test_arctic_plugin_is_inert_next_to_ours():
    """vLLM loads every `vllm.general_plugins` entry point; Arctic's patches vLLM only when
    ARCTIC_INFERENCE_ENABLED=1 (and refuses vLLM 0.32 then). Unset, loading both changes nothing ours does not:
    no Arctic patch module imported, no environment variable set, no attribute of vLLM's modules changed."""
    script = textwrap.dedent('''
        import importlib, json, os, sys
        from importlib.metadata import entry_points
        modules = ["vllm.v1.worker.gpu_model_runner", "vllm.v1.spec_decode.suffix_decoding", "vllm.config.speculative",
                   "vllm.engine.arg_utils", "vllm.v1.core.sched.scheduler", "vllm.v1.sample.rejection_sampler",
                   "vllm.v1.attention.backends.cpu_attn", "vllm.model_executor.layers.logits_processor"]
        def state():
            seen = {}
            for name in modules:
                module = importlib.import_module(name)
                for key, value in vars(module).items():
                    seen[f"{name}.{key}"] = id(value)
                    if isinstance(value, type) and value.__module__ == name:
                        for attr, member in vars(value).items():
                            seen[f"{name}.{key}.{attr}"] = id(member)
            return seen
        from vllm_adaptivespec.engine import plugin
        plugin.register()  # ours first, so only Arctic's changes remain to be seen
        env, before = dict(os.environ), state()
        (arctic,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "arctic_inference"]
        arctic.load()()
        after = state()
        print(json.dumps({
            "plugins": sorted(ep.name for ep in entry_points(group="vllm.general_plugins")),
            "watched": len(before),
            "changed": sorted(k for k in before if after.get(k) != before[k]),
            "env": sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k)),
            "patch_modules": sorted(m for m in sys.modules if m.startswith("arctic_inference.vllm.")
                                    and m != "arctic_inference.vllm.plugin"),
        }))
    ''')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCTIC_INFERENCE_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"adaptivespec", "arctic_inference"} <= set(report["plugins"]) and report["watched"] > 1000
    assert report == {**report, "changed": [], "env": [], "patch_modules": []}
    assert "Arctic Inference plugin is enabled" not in done.stderr

    # Switched on, it refuses vLLM 0.32 (and CPU) before patching anything, loudly.
    refused = subprocess.run(
        [sys.executable, "-c", "from arctic_inference.vllm.plugin import arctic_inference_plugin as p; p()"],
        capture_output=True, text=True, env={**env, "ARCTIC_INFERENCE_ENABLED": "1"}, timeout=300)
    assert refused.returncode != 0 and "RuntimeError: Arctic Inference" in refused.stderr
