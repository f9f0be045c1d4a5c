"""The benchmark's configurations: one table row each, turned into vLLM engine arguments.

A row names a decoding method and the stock `speculative_config` / AdaptiveSpec settings it runs
with. Rows marked ``per_tau`` are swept over the run's tau values and named ``<row>@<tau>``
(``adaptive@0.5``). Adding a configuration is adding a row.

A row may need an optional package (``Row.needs``): vLLM's ``suffix`` method imports Arctic Inference's
suffix-tree cache. Where that package does not import, selecting the row rejects it with the reason
(the run reports it under "Configurations not run" and goes on without it).
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

DRAFTER = "<drafter>"  # replaced by the drafter's path
TAU = "<tau>"  # replaced by each tau of the sweep

KINDS = ("ar", "static", "ngram", "suffix", "dynamic", "static-tree", "adaptivespec")
STOCK_KINDS = ("static", "ngram", "suffix", "dynamic")  # stock vLLM speculation, the references to beat
# Every stock configuration that runs everywhere: "best stock" is the best of all of them in one run, never
# of a subset (the report prints no best-stock ratio for a run that lacks one of them). A stock row that
# needs an optional package (suffix) joins the set in every run that selected it; where the package is
# missing the row is rejected at selection, named in the report, and best stock is over the rest.
STOCK_SET = ("static-k1", "static-k2", "static-k3", "static-k4", "ngram", "dynamic")

# vLLM's suffix decoding (method "suffix": Arctic Inference's suffix trees over the request's prompt and
# output and over earlier responses). The suffix settings are vLLM 0.32's defaults, written out so a run
# records them. Two ceilings: `suffix`, 8 tokens a step (the deepest any other row drafts), and `suffix-k24`,
# vLLM's own default (the tree depth, 24), which a user running stock suffix decoding gets; on the edit workload
# at batch 1 it took 268 decode steps where 8 took 323 (benchmarks/results/free-copies-k24-s25), so both are
# stock configurations to beat.
# How long a draft is each step follows the match: at most max_spec_factor x the matched suffix length,
# only tokens whose estimated probability is at least min_token_prob.
SUFFIX = {
    "method": "suffix",
    "num_speculative_tokens": 8,
    "suffix_decoding_max_tree_depth": 24,
    "suffix_decoding_max_cached_requests": 10000,
    "suffix_decoding_max_spec_factor": 1.0,
    "suffix_decoding_min_token_prob": 0.1,
}
SUFFIX_DEFAULT = {**SUFFIX, "num_speculative_tokens": 24}  # vLLM's default: suffix_decoding_max_tree_depth
# What a row may need beyond vLLM: the module vLLM imports for it, and how to get it.
OPTIONAL_MODULES = {
    "arctic_inference.suffix_decoding": "Arctic Inference's suffix decoding cache (pip package arctic-inference, "
                                        "source only: scripts/setup.sh builds it)",
}


@lru_cache(maxsize=None)
def missing_module(module: str) -> str | None:
    """Why ``module`` cannot be used here (it is imported, native extension included), or None if it can."""
    try:
        importlib.import_module(module)
    except Exception as err:  # an ImportError, or a native extension that fails to load
        return f"needs {OPTIONAL_MODULES.get(module, module)}; importing {module} failed: {type(err).__name__}: {err}"
    return None


def _draft(k: int, **extra: Any) -> dict:
    return {"method": "draft_model", "model": DRAFTER, "num_speculative_tokens": k, **extra}


def _tree(**settings: Any) -> dict:
    """AdaptiveSpec tree-mode settings (vLLM's ``num_speculative_tokens`` is then the node ceiling)."""
    return {"mode": "tree", **settings}


# The fixed tree: depth 4 like static-k4, two children per node, 8 nodes (the top-1 chain plus its
# best siblings), so it costs the same 4 drafter passes as static-k4 and verifies 9 tokens.
STATIC_TREE = _tree(tau=1.0, min_depth=4, max_depth=4, min_width=2, max_width=2, min_nodes=8, max_nodes=8)


@dataclass(frozen=True)
class Row:
    name: str
    kind: str
    speculative: dict | None
    adaptivespec: dict | None = None
    per_tau: bool = False
    depth: int | None = None  # fixed draft depth, None when it varies per step
    about: str = ""
    lossless_twin: str | None = None  # for a swept row: the row it equals at tau = 1
    stock_twin: str | None = None  # for a pinned row: the stock row of the same shape (paired in the report)
    needs: str | None = None  # a module vLLM imports for this row (see OPTIONAL_MODULES)


# vLLM's batch-size schedule for dynamic speculation: (first batch size, last batch size, k).
DYNAMIC_SCHEDULE = [[1, 1, 6], [2, 4, 4], [5, 1024, 2]]

# The lossy budget's widest settings: margin promotions bounded by tau alone.
NO_LOSSY_BUDGET = {"max_promotions_per_step": 64, "max_promotions_per_window": 1_000_000, "promotion_min_acceptance": 0.0}

TABLE: tuple[Row, ...] = (
    Row("ar", "ar", None, about="autoregressive target, no speculation"),
    Row("static-k1", "static", _draft(1), depth=1, about="vLLM draft-model speculation, k=1"),
    Row("static-k2", "static", _draft(2), depth=2, about="vLLM draft-model speculation, k=2"),
    Row("static-k3", "static", _draft(3), depth=3, about="vLLM draft-model speculation, k=3"),
    Row("static-k4", "static", _draft(4), depth=4, about="vLLM draft-model speculation, k=4"),
    Row("static-k6", "static", _draft(6), depth=6, about="vLLM draft-model speculation, k=6"),
    Row("static-k8", "static", _draft(8), depth=8, about="vLLM draft-model speculation, k=8"),
    Row("ngram", "ngram",
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
        depth=4, about="vLLM n-gram (prompt lookup) speculation, k=4, n in [2, 4]"),
    Row("suffix", "suffix", SUFFIX, needs="arctic_inference.suffix_decoding",
        about="vLLM suffix decoding (Arctic Inference suffix trees over prompt, output and earlier responses), "
              "up to 8 tokens a step, vLLM's default suffix settings"),
    Row("suffix-k24", "suffix", SUFFIX_DEFAULT, needs="arctic_inference.suffix_decoding",
        about="vLLM suffix decoding as vLLM configures it by default: up to 24 tokens a step (the tree depth)"),
    Row("dynamic", "dynamic", _draft(8, num_speculative_tokens_per_batch_size=DYNAMIC_SCHEDULE),
        about=f"vLLM dynamic speculation, batch-size schedule {DYNAMIC_SCHEDULE}"),
    Row("policy-only", "adaptivespec", _draft(8), {"tau": 1.0, "max_depth": 8},
        about="AdaptiveSpec shape policy, exact verification (lossless)"),
    Row("policy-first-pass", "adaptivespec", _draft(8), {"tau": 1.0, "max_depth": 8, "replan_each_pass": False},
        about="AdaptiveSpec shape policy with each chain's depth fixed at the first pass (replan_each_pass false), "
              "lossless: beside policy-only, what re-planning after every pass adds"),
    Row("pinned-k2", "adaptivespec", _draft(2), {"tau": 1.0, "min_depth": 2, "max_depth": 2, "min_nodes": 2}, depth=2,
        about="AdaptiveSpec lossless pinned to depth 2 (same shape as static-k2: the plugin's own overhead)",
        stock_twin="static-k2"),
    Row("pinned-k4", "adaptivespec", _draft(4), {"tau": 1.0, "min_depth": 4, "max_depth": 4, "min_nodes": 4}, depth=4,
        about="AdaptiveSpec lossless pinned to depth 4 (same shape as static-k4: the plugin's own overhead)",
        stock_twin="static-k4"),
    Row("margin-k4", "adaptivespec", _draft(4), {"tau": TAU, "min_depth": 4, "max_depth": 4},
        per_tau=True, depth=4, about="AdaptiveSpec margin rule at a static depth of 4", lossless_twin="static-k4"),
    Row("adaptive", "adaptivespec", _draft(8), {"tau": TAU, "max_depth": 8},
        per_tau=True, about="full AdaptiveSpec: shape policy + margin rule", lossless_twin="policy-only"),
    Row("unguarded", "adaptivespec", _draft(8), {"tau": TAU, "max_depth": 8, **NO_LOSSY_BUDGET},
        per_tau=True, about="full AdaptiveSpec with the lossy budget off (promotions limited by nothing but tau): "
                            "what the guard prevents", lossless_twin="policy-only"),
    Row("unguarded-k4", "adaptivespec", _draft(4), {"tau": TAU, "min_depth": 4, "max_depth": 4, **NO_LOSSY_BUDGET},
        per_tau=True, depth=4, about="margin rule at a static depth of 4 with the lossy budget off: beside margin-k4, "
                                     "what the guard does where the drafts cannot shrink", lossless_twin="static-k4"),
    Row("static-tree", "static-tree", _draft(8), STATIC_TREE, depth=4,
        about="fixed draft tree (depth 4, width 2, 8 nodes) on AdaptiveSpec's tree path, exact verification"),
    Row("tree-policy-only", "adaptivespec", _draft(24), _tree(tau=1.0, max_depth=8),
        about="AdaptiveSpec tree policy (depth, width, nodes per step), exact verification (lossless)"),
    Row("adaptive-tree", "adaptivespec", _draft(24), _tree(tau=TAU, max_depth=8),
        per_tau=True, about="full AdaptiveSpec tree: tree policy + margin rule", lossless_twin="tree-policy-only"),
)

ROWS = {row.name: row for row in TABLE}


@dataclass(frozen=True)
class BenchConfig:
    """One configuration ready to run: its name and the engine arguments it differs by."""

    name: str
    row: str
    kind: str
    tau: float | None
    depth: int | None
    speculative_config: dict | None
    adaptivespec: dict | None
    about: str = ""
    needs_drafter: bool = False

    def engine_args(self) -> dict:
        return {
            "speculative_config": self.speculative_config,
            "additional_config": {"adaptivespec": self.adaptivespec} if self.adaptivespec else None,
        }


@dataclass(frozen=True)
class Rejected:
    name: str
    reason: str


def format_tau(tau: float) -> str:
    return f"{tau:g}"


def _substitute(value: Any, drafter: str | None, tau: float | None) -> Any:
    if isinstance(value, dict):
        return {k: _substitute(v, drafter, tau) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, drafter, tau) for v in value]
    if value == DRAFTER:
        return drafter
    if value == TAU:
        return tau
    return value


def _uses(value: Any, placeholder: str) -> bool:
    if isinstance(value, dict):
        return any(_uses(v, placeholder) for v in value.values())
    if isinstance(value, list):
        return any(_uses(v, placeholder) for v in value)
    return value == placeholder


def build(row: Row, drafter: str | None, tau: float | None = None) -> BenchConfig:
    """The row's configuration (at ``tau`` for a swept row); raises ValueError if it is invalid."""
    if row.per_tau and tau is None:
        raise ValueError(f"{row.name!r} is swept over tau; name one as {row.name}@<tau>")
    if not row.per_tau and tau is not None:
        raise ValueError(f"{row.name!r} takes no tau")
    if tau is not None and not (0.0 < tau <= 1.0 and math.isfinite(tau)):
        raise ValueError(f"tau must be in (0, 1] (got {tau})")
    if row.needs is not None and (problem := missing_module(row.needs)) is not None:
        raise ValueError(problem)
    adaptivespec = _substitute(row.adaptivespec, drafter, tau)
    if adaptivespec is not None:
        from vllm_adaptivespec.config import AdaptiveSpecConfig

        AdaptiveSpecConfig.parse(adaptivespec)  # raises with one line per bad field
    name = f"{row.name}@{format_tau(tau)}" if tau is not None else row.name
    return BenchConfig(
        name=name,
        row=row.name,
        kind=row.kind,
        tau=tau if tau is not None else (adaptivespec or {}).get("tau"),
        depth=row.depth,
        speculative_config=_substitute(row.speculative, drafter, tau),
        adaptivespec=adaptivespec,
        about=row.about,
        needs_drafter=_uses(row.speculative, DRAFTER),
    )


def build_with_overrides(name: str, drafter: str | None) -> BenchConfig:
    """A row by name (``<row>@<tau>`` for a swept row), its AdaptiveSpec settings overridden after ``+`` (values
    read as JSON, else as text): ``policy-only+allow_off=false+max_depth=4``, ``adaptive@0.5+max_depth=4``; ``k=<n>``
    sets vLLM's ``num_speculative_tokens`` of any speculative row instead (``suffix+k=24``: vLLM's own default
    ceiling for suffix decoding). For experiments (``benchmarks/paired.py``); raises ValueError for an unknown row,
    a setting the row does not have (AdaptiveSpec settings on a stock row, ``k`` on ``ar``) or a bad value (naming
    the field)."""
    from dataclasses import replace

    from vllm_adaptivespec.config import AdaptiveSpecConfig

    base, *overrides = name.split("+")
    row_name, _, tau_text = base.partition("@")
    if row_name not in ROWS:
        raise ValueError(f"unknown configuration {row_name!r}; known: {', '.join(known_names())}")
    try:
        tau = float(tau_text) if tau_text else None
    except ValueError:
        raise ValueError(f"tau {tau_text!r} in {name!r} is not a number") from None
    config = build(ROWS[row_name], drafter, tau)
    if not overrides:
        return config
    settings, speculative = dict(config.adaptivespec or {}), dict(config.speculative_config or {})
    for item in overrides:
        key, _, text = item.partition("=")
        if key == "k":
            if not speculative:
                raise ValueError(f"{row_name!r} does not speculate: it has no num_speculative_tokens (k) to override")
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"k (num_speculative_tokens) must be a positive integer (got {text!r})")
            speculative["num_speculative_tokens"] = int(text)
            continue
        if config.adaptivespec is None:
            raise ValueError(f"{row_name!r} is not an AdaptiveSpec row: it has no settings to override ({key})")
        try:
            settings[key] = json.loads(text)
        except ValueError:
            settings[key] = text
    if config.adaptivespec is not None:
        AdaptiveSpecConfig.parse(settings)  # raises with one line per bad field
    return replace(config, name=name, adaptivespec=settings or None, speculative_config=speculative or None,
                   depth=speculative.get("num_speculative_tokens") if config.depth is not None else None)


def known_names() -> list[str]:
    names = ["all", *KINDS[1:]]
    for row in TABLE:
        names.append(f"{row.name}[@<tau>]" if row.per_tau else row.name)
    return names


def select(names: list[str], taus: list[float], drafter: str | None) -> tuple[list[BenchConfig], list[Rejected]]:
    """Resolve requested names into configurations, in table order, without duplicates.

    Accepted: a row name (a swept row expands over ``taus``), ``<row>@<tau>``, a kind
    (``static`` = every static row) or ``all``. Anything else is returned as `Rejected`
    with the reason, so the caller can report it and run the rest; so is a row whose optional package is
    missing here (``Row.needs``), under its own name, also when a kind or ``all`` asked for it.
    """
    wanted: dict[str, BenchConfig] = {}
    rejected: list[Rejected] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        try:
            configs, unavailable = _expand(name, taus, drafter)
        except ValueError as err:
            rejected.append(Rejected(name, str(err)))
            continue
        for config in configs:
            wanted.setdefault(config.name, config)
        for reason in unavailable:
            if all(seen.name != reason.name for seen in rejected):
                rejected.append(reason)
    order = {row.name: i for i, row in enumerate(TABLE)}
    configs = sorted(wanted.values(), key=lambda c: (order[c.row], -(c.tau or 0.0)))
    return configs, rejected


def _expand(name: str, taus: list[float], drafter: str | None) -> tuple[list[BenchConfig], list[Rejected]]:
    """The configurations ``name`` stands for, and the rows of it that need a package missing here."""
    if name == "all":
        rows = list(TABLE)
    elif name in KINDS:
        rows = [row for row in TABLE if row.kind == name]
    elif "@" in name:
        base, _, tau_text = name.partition("@")
        row = ROWS.get(base)
        if row is None:
            raise ValueError(f"unknown configuration {base!r}; known: {', '.join(known_names())}")
        try:
            tau = float(tau_text)
        except ValueError:
            raise ValueError(f"tau {tau_text!r} in {name!r} is not a number") from None
        return [build(row, drafter, tau)], []
    elif name in ROWS:
        rows = [ROWS[name]]
    else:
        raise ValueError(f"unknown configuration {name!r}; known: {', '.join(known_names())}")
    configs, unavailable = [], []
    for row in rows:
        if row.needs is not None and (problem := missing_module(row.needs)) is not None:
            unavailable.append(Rejected(row.name, problem))
            continue
        if row.per_tau:
            if not taus:
                raise ValueError(f"{row.name!r} is swept over tau but no tau values were given")
            configs.extend(build(row, drafter, tau) for tau in taus)
        else:
            configs.append(build(row, drafter))
    return configs, unavailable
