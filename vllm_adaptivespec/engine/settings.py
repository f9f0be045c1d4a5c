"""AdaptiveSpec settings as carried by vLLM: `additional_config={"adaptivespec": {...}}`.

vLLM's SpeculativeConfig forbids extra keys, while `additional_config` reaches every process
(front end, engine core, workers) and is part of the config hash, so the settings live there and the
drafter stays configured through the stock `speculative_config`.
"""

from __future__ import annotations

from typing import Any, Mapping

from vllm_adaptivespec.config import AdaptiveSpecConfig, AdaptiveSpecConfigError

KEY = "adaptivespec"
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
    budget = int(speculative_config.num_speculative_tokens)
    explicit = raw if isinstance(raw, Mapping) else config.model_dump(exclude_unset=True)
    if "max_depth" not in explicit:
        # num_speculative_tokens is the ceiling vLLM sizes its buffers for: use all of it.
        config = config.with_overrides(
            max_depth=budget,
            min_depth=min(config.min_depth, budget),
            max_nodes=max(config.max_nodes, budget),
            min_nodes=min(config.min_nodes, budget),
        )
    if config.max_depth > budget:
        raise AdaptiveSpecConfigError(
            f"adaptivespec.max_depth: must be <= speculative_config.num_speculative_tokens "
            f"({budget}), which sizes vLLM's draft buffers (got {config.max_depth}); raise "
            f"num_speculative_tokens or lower max_depth"
        )
    if config.mode != "chain":
        raise AdaptiveSpecConfigError(
            f"adaptivespec.mode: only 'chain' runs inside vLLM so far; tree verification in "
            f"the engine is not implemented yet (got {config.mode!r})"
        )
    return config


def settings_for(vllm_config: Any) -> AdaptiveSpecConfig | None:
    """Settings for an engine/worker whose config was already validated in the front end."""
    raw = raw_settings(getattr(vllm_config, "additional_config", None))
    if raw is None:
        return None
    config = resolve(raw, vllm_config.speculative_config)
    return config if config.enabled else None
