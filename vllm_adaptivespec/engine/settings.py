"""AdaptiveSpec settings as carried by vLLM: `additional_config={"adaptivespec": {...}}`.

vLLM's SpeculativeConfig forbids extra keys, while `additional_config` reaches every process
(front end, engine core, workers) and is part of the config hash, so the settings live there and the
drafter stays configured through the stock `speculative_config`.
"""

from __future__ import annotations

from typing import Any, Mapping

from vllm_adaptivespec.config import AdaptiveSpecConfig, AdaptiveSpecConfigError

KEY = "adaptivespec"
DEBUG_KEY = "adaptivespec_debug"  # test-only knobs, beside the validated settings
# random_shapes=<seed>: a random tree shape per request and step (chains: the step's drafting also stops at a
# random pass, each chain cut there); random_off=<seed>: speculation switched
# off for the whole step (no drafter pass) at random, about every other step, and half the other steps
# catching up one request chosen at random, as a probe does (draft models);
# record_steps=<n>: keep the last n verification steps' records for `AdaptiveState.take_step_log`
DEBUG_KNOBS = {"random_shapes": int, "random_off": int, "record_steps": int}
SUPPORTED_METHODS = ("draft_model", "eagle", "eagle3")


def raw_settings(additional_config: Any) -> Any | None:
    """The user's `adaptivespec` entry, or None when AdaptiveSpec was not asked for."""
    if isinstance(additional_config, Mapping):
        return additional_config.get(KEY)
    return None


def resolve(raw: Any, speculative_config: Any) -> AdaptiveSpecConfig:
    """Validate the user's settings against the drafter configuration; raise naming the field."""
    config = AdaptiveSpecConfig.parse(raw)
    if speculative_config is None or getattr(speculative_config, "method", None) is None:
        raise AdaptiveSpecConfigError(
            "adaptivespec: AdaptiveSpec needs a drafter; pass --speculative-config "
            "(speculative_config=) with method 'draft_model' or 'eagle3' and num_speculative_tokens"
        )
    method = speculative_config.method
    if method not in SUPPORTED_METHODS:
        raise AdaptiveSpecConfigError(
            f"speculative_config.method: AdaptiveSpec works with {', '.join(SUPPORTED_METHODS)} "
            f"(got {method!r})"
        )
    if getattr(speculative_config, "rejection_sample_method", "standard") != "standard":
        raise AdaptiveSpecConfigError(
            "speculative_config.rejection_sample_method: AdaptiveSpec replaces verification and "
            f"needs 'standard' (got {speculative_config.rejection_sample_method!r})"
        )
    for flag, why in (
        ("use_heterogeneous_vocab", "drafts are ranked over the target's vocabulary"),
        ("parallel_drafting", "trees are drafted level by level"),
    ):
        if getattr(speculative_config, flag, False):
            raise AdaptiveSpecConfigError(f"speculative_config.{flag}: AdaptiveSpec needs it off ({why})")
    budget = int(speculative_config.num_speculative_tokens)
    explicit = raw if isinstance(raw, Mapping) else config.model_dump(exclude_unset=True)
    if config.mode == "chain" and "max_depth" not in explicit:
        # num_speculative_tokens is the ceiling vLLM sizes its buffers for: use all of it.
        config = config.with_overrides(
            max_depth=budget,
            min_depth=min(config.min_depth, budget),
            max_nodes=max(config.max_nodes, budget),
            min_nodes=min(config.min_nodes, budget),
        )
    elif config.mode == "tree":
        # In tree mode num_speculative_tokens is the per-request node ceiling (vLLM's draft buffers,
        # its per-position acceptance stats and its KV lookahead are all sized by it).
        max_nodes = config.max_nodes if "max_nodes" in explicit else budget
        max_depth = config.max_depth if "max_depth" in explicit else min(config.max_depth, max_nodes)
        config = config.with_overrides(
            max_nodes=max_nodes,
            min_nodes=min(config.min_nodes, max_nodes),
            max_depth=max_depth,
            min_depth=min(config.min_depth, max_depth),
        )
        if config.max_nodes > budget:
            raise AdaptiveSpecConfigError(
                f"adaptivespec.max_nodes: must be <= speculative_config.num_speculative_tokens "
                f"({budget}), which sizes vLLM's draft buffers (got {config.max_nodes}); raise "
                f"num_speculative_tokens or lower max_nodes"
            )
    if config.max_depth > budget:
        raise AdaptiveSpecConfigError(
            f"adaptivespec.max_depth: must be <= speculative_config.num_speculative_tokens "
            f"({budget}), which sizes vLLM's draft buffers (got {config.max_depth}); raise "
            f"num_speculative_tokens or lower max_depth"
        )
    return config


def debug_settings(vllm_config: Any) -> dict[str, Any]:
    """The ``adaptivespec_debug`` entry of ``additional_config`` (empty when absent)."""
    extra = getattr(vllm_config, "additional_config", None)
    raw = extra.get(DEBUG_KEY) if isinstance(extra, Mapping) else None
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise AdaptiveSpecConfigError(f"{DEBUG_KEY}: must be an object (got {raw!r})")
    for name, value in raw.items():
        kind = DEBUG_KNOBS.get(name)
        if kind is None:
            raise AdaptiveSpecConfigError(f"{DEBUG_KEY}.{name}: unknown key; allowed: {', '.join(DEBUG_KNOBS)}")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise AdaptiveSpecConfigError(f"{DEBUG_KEY}.{name}: must be {kind.__name__} (got {value!r})")
    return dict(raw)


def settings_for(vllm_config: Any) -> AdaptiveSpecConfig | None:
    """Settings for an engine/worker whose config was already validated in the front end."""
    raw = raw_settings(getattr(vllm_config, "additional_config", None))
    if raw is None:
        return None
    config = resolve(raw, vllm_config.speculative_config)
    return config if config.enabled else None
