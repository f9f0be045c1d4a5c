"""Every AdaptiveSpec knob in one validated, immutable object.

Validation happens once, up front: a bad value is reported with the field name and the
allowed range (``adaptivespec.tau: must be a number in (0, 1] (got 1.5)``), every bad field at
once, instead of surfacing later as a strange tree or a silent fallback.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

_PREFIX = "adaptivespec."


class AdaptiveSpecConfigError(ValueError):
    """A configuration was rejected; the message has one ``adaptivespec.<field>: ...`` line per problem."""

    def __init__(self, problems: str | list[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("invalid AdaptiveSpec configuration:\n  " + "\n  ".join(self.problems))


class AdaptiveSpecConfig(BaseModel):
    """AdaptiveSpec settings. Units: depth in tokens, width in children per node, nodes in draft tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    enabled: bool = Field(True, description="Adapt the shape and apply the margin rule; off = vLLM's own speculation.")
    mode: Literal["chain", "tree"] = Field("chain", description="Draft a chain (width 1) or a tree.")

    tau: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Margin threshold: accept a drafted non-top-1 token when p(token)/p(top1) >= tau. "
        "1 turns the margin rule off (lossless).",
    )

    min_request_tau: float = Field(
        0.1,
        gt=0.0,
        le=1.0,
        description="Loosest tau a single request may ask for (vllm_xargs adaptivespec_tau, checked against it); "
        "requests may always ask for 1 (lossless).",
    )

    min_depth: int = Field(1, ge=1, le=64, description="Shallowest draft (tokens).")
    max_depth: int = Field(6, ge=1, le=64, description="Deepest draft (tokens).")
    min_width: int = Field(1, ge=1, le=16, description="Fewest children per expanded node.")
    max_width: int = Field(4, ge=1, le=16, description="Most children per expanded node.")
    min_nodes: int = Field(
        1, ge=1, le=128, description="Floor of the per-sequence node cap (batch pressure, measured verify cost)."
    )
    max_nodes: int = Field(24, ge=1, le=128, description="Most draft nodes per sequence and step.")

    history_window: int = Field(16, ge=1, le=4096, description="Steps kept in the rolling acceptance history.")
    confidence_weight: float = Field(
        0.5, ge=0.0, le=1.0, description="Weight of the drafter's top-1 confidence in the fused signal (rest: history)."
    )
    prior_acceptance: float = Field(
        0.6, ge=0.0, le=1.0, description="Acceptance rate assumed before a request has any history."
    )

    draft_cost: float = Field(
        0.3,
        ge=0.0,
        le=10.0,
        description="Time of one drafter pass relative to one target verification step; depth is chosen "
        "where another draft token stops paying for its pass (0.3 ~ a 0.5B drafter for a 1.5B target, "
        "~0.05 for an EAGLE head). With measure_draft_cost, only the value until both are timed.",
    )
    measure_draft_cost: bool = Field(
        True,
        description="Replace draft_cost by the measured ratio of a drafter pass to a target forward on the "
        "hardware at hand (timed every step); false = keep draft_cost fixed.",
    )
    allow_off: bool = Field(
        True,
        description="Let the step-cost model switch speculation off (depth 0) per request and for a whole step, "
        "where plain decoding is faster; a whole step off runs no drafter pass (draft models; the drafter "
        "catches up on the missed tokens at its next pass). false = every step drafts at least min_depth.",
    )
    replan_each_pass: bool = Field(
        True,
        description="Chains: after every drafter pass, re-plan the step with the drafted tokens' own confidences: "
        "drafting stops where one more pass no longer pays and goes past the first pass's plan (up to max_depth) "
        "while the drafter stays sure. false = each chain's depth is fixed at the first pass.",
    )
    probe_every: int = Field(
        16,
        ge=1,
        le=1_000_000,
        description="After this many steps in a row with speculation off, one step drafts min_depth anyway, to "
        "refresh the acceptance estimates (the cost of looking): with a draft model for one request, the one whose "
        "drafter owes the fewest tokens; with an EAGLE head for every request that went that long without a "
        "draft. Each probe after which speculation stays off doubles the wait, up to 16x. No probes where "
        "the measured costs say even a never-wrong drafter could not pay.",
    )
    free_drafter: Literal["off", "ngram", "suffix"] = Field(
        "ngram",
        description="A second draft source that costs no drafter pass: 'ngram' copies the tokens that "
        "followed the longest earlier match of the request's last tokens in its own prompt and output (vLLM's "
        "prompt-lookup matcher); 'suffix' asks Arctic Inference's suffix decoding cache (the request's text and "
        "earlier requests' responses; needs arctic-inference). Each step the plan drafts a request from the source "
        "with the higher expected acceptance (tree mode: the copy is also one more branch of every drafter tree); "
        "a step whose drafts all come from it runs no drafter pass. 'off' = the drafter model only.",
    )
    free_min_match: int = Field(2, ge=1, le=16, description="Shortest match (tokens) that yields an ngram draft.")
    free_max_match: int = Field(4, ge=1, le=16, description="Longest match (tokens) the ngram source looks for.")
    wide_below: float = Field(0.3, ge=0.0, le=1.0, description="Signal at or below which width = max_width.")
    narrow_above: float = Field(
        0.7, ge=0.0, le=1.0, description="Signal at or above which width = min_width (a chain when min_width = 1)."
    )

    max_promotions_per_step: int = Field(2, ge=0, le=64, description="Most margin promotions in one step.")
    max_promotions_per_window: int = Field(
        8, ge=0, le=1_000_000, description="Most margin promotions within any history_window consecutive steps."
    )
    promotion_min_acceptance: float = Field(
        0.7,
        ge=0.0,
        le=1.0,
        description="No promotions while the drafter's rolling agreement with the target (strict acceptance per "
        "judged position, promotions not counted) is below this (0 = no floor).",
    )

    batch_node_budget: int = Field(
        512,
        ge=1,
        le=1_000_000,
        description="Draft nodes per step over the whole batch; per-sequence cap = max(min_nodes, budget // batch).",
    )

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise _config_error(err) from None

    @model_validator(mode="after")
    def _check_cross_fields(self) -> AdaptiveSpecConfig:
        problems = []
        for low, high in (
            ("min_depth", "max_depth"),
            ("min_width", "max_width"),
            ("min_nodes", "max_nodes"),
            ("free_min_match", "free_max_match"),
        ):
            if getattr(self, low) > getattr(self, high):
                problems.append(
                    f"{_PREFIX}{low}: must be <= {high} ({getattr(self, high)}) (got {getattr(self, low)})"
                )
        if self.max_nodes < self.max_depth:
            problems.append(
                f"{_PREFIX}max_nodes: must be >= max_depth ({self.max_depth}) so the deepest chain fits "
                f"(got {self.max_nodes})"
            )
        for low, high in (("wide_below", "narrow_above"),):
            if getattr(self, low) >= getattr(self, high):
                problems.append(
                    f"{_PREFIX}{low}: must be < {high} ({getattr(self, high)}) (got {getattr(self, low)})"
                )
        if self.tau < self.min_request_tau:
            problems.append(
                f"{_PREFIX}tau: must be >= min_request_tau ({self.min_request_tau}), the loosest margin "
                f"this server allows (got {self.tau})"
            )
        if self.max_promotions_per_step > self.max_promotions_per_window:
            problems.append(
                f"{_PREFIX}max_promotions_per_step: must be <= max_promotions_per_window "
                f"({self.max_promotions_per_window}) (got {self.max_promotions_per_step})"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def lossless(self) -> bool:
        """True when the margin rule is off: verification is exact token matching / exact rejection sampling."""
        return self.tau >= 1.0

    @classmethod
    def parse(cls, value: dict | str | None | AdaptiveSpecConfig) -> AdaptiveSpecConfig:
        """Build from a dict, a JSON object string, None (defaults) or an existing config."""
        if value is None:
            return cls()
        if isinstance(value, AdaptiveSpecConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as err:
                raise AdaptiveSpecConfigError([f"{_PREFIX}<json>: not valid JSON: {err}"]) from None
        if not isinstance(value, dict):
            raise AdaptiveSpecConfigError(
                [f"{_PREFIX}<config>: must be a JSON object / dict (got {type(value).__name__})"]
            )
        bad_keys = [key for key in value if not isinstance(key, str)]
        if bad_keys:
            raise AdaptiveSpecConfigError([f"{_PREFIX}<config>: keys must be strings (got {bad_keys!r})"])
        return cls(**value)

    def with_overrides(self, **overrides: Any) -> AdaptiveSpecConfig:
        """A validated copy with some fields replaced (for example a per-request ``tau``)."""
        if not overrides:
            return self
        return type(self).parse({**self.model_dump(), **overrides})


def _range_text(name: str) -> str:
    """Human description of a field's allowed values, derived from its declared constraints."""
    info = AdaptiveSpecConfig.model_fields[name]
    annotation = info.annotation
    if annotation is bool:
        return "must be true or false"
    if getattr(annotation, "__origin__", None) is Literal:
        return "must be one of " + ", ".join(repr(v) for v in annotation.__args__)
    low = high = None
    low_open = high_open = False
    for meta in info.metadata:
        if isinstance(meta, annotated_types.Gt):
            low, low_open = meta.gt, True
        elif isinstance(meta, annotated_types.Ge):
            low = meta.ge
        elif isinstance(meta, annotated_types.Lt):
            high, high_open = meta.lt, True
        elif isinstance(meta, annotated_types.Le):
            high = meta.le
    kind = "an integer" if annotation is int else "a number"
    if low is None and high is None:
        return f"must be {kind}"
    return f"must be {kind} in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def _config_error(err: ValidationError) -> AdaptiveSpecConfigError:
    problems = []
    allowed = ", ".join(AdaptiveSpecConfig.model_fields)
    for item in err.errors():
        loc = item.get("loc") or ()
        if not loc:
            # Cross-field problems come pre-formatted from _check_cross_fields.
            message = str(item.get("ctx", {}).get("error", item.get("msg", "")))
            problems.extend(line for line in message.splitlines() if line)
            continue
        name = str(loc[0])
        got = item.get("input")
        if item.get("type") == "extra_forbidden":
            problems.append(f"{_PREFIX}{name}: unknown key; allowed keys: {allowed} (got {got!r})")
        elif name in AdaptiveSpecConfig.model_fields:
            problems.append(f"{_PREFIX}{name}: {_range_text(name)} (got {got!r})")
        else:
            problems.append(f"{_PREFIX}{name}: {item.get('msg')} (got {got!r})")
    return AdaptiveSpecConfigError(problems or [f"{_PREFIX}<config>: {err}"])
