"""The benchmark's configurations: one table row each, turned into vLLM engine arguments.

A row names a decoding method and the stock `speculative_config` / AdaptiveSpec settings it runs
with. Rows marked ``per_tau`` are swept over the run's tau values and named ``<row>@<tau>``
(``adaptive@0.5``). Adding a configuration is adding a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DRAFTER = "<drafter>"  # replaced by the drafter's path
TAU = "<tau>"  # replaced by each tau of the sweep

KINDS = ("ar", "static", "ngram", "dynamic", "static-tree", "adaptivespec")
STOCK_KINDS = ("static", "ngram", "dynamic")  # stock vLLM speculation, the references to beat
# Every stock configuration that runs here: "best stock" is the best of all of them in one run, never
# of a subset (the report prints no best-stock ratio for a run that lacks one of them).
STOCK_SET = ("static-k1", "static-k2", "static-k3", "static-k4", "ngram", "dynamic")


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


# vLLM's batch-size schedule for dynamic speculation: (first batch size, last batch size, k).
DYNAMIC_SCHEDULE = [[1, 1, 6], [2, 4, 4], [5, 1024, 2]]

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
    Row("dynamic", "dynamic", _draft(8, num_speculative_tokens_per_batch_size=DYNAMIC_SCHEDULE),
        about=f"vLLM dynamic speculation, batch-size schedule {DYNAMIC_SCHEDULE}"),
    Row("policy-only", "adaptivespec", _draft(8), {"tau": 1.0, "max_depth": 8},
        about="AdaptiveSpec shape policy, exact verification (lossless)"),
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


def known_names() -> list[str]:
    names = ["all", *KINDS[1:]]
    for row in TABLE:
        names.append(f"{row.name}[@<tau>]" if row.per_tau else row.name)
    return names


def select(names: list[str], taus: list[float], drafter: str | None) -> tuple[list[BenchConfig], list[Rejected]]:
    """Resolve requested names into configurations, in table order, without duplicates.

    Accepted: a row name (a swept row expands over ``taus``), ``<row>@<tau>``, a kind
    (``static`` = every static row) or ``all``. Anything else is returned as `Rejected`
    with the reason, so the caller can report it and run the rest.
    """
    wanted: dict[str, BenchConfig] = {}
    rejected: list[Rejected] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        try:
            for config in _expand(name, taus, drafter):
                wanted.setdefault(config.name, config)
        except ValueError as err:
            rejected.append(Rejected(name, str(err)))
    order = {row.name: i for i, row in enumerate(TABLE)}
    configs = sorted(wanted.values(), key=lambda c: (order[c.row], -(c.tau or 0.0)))
    return configs, rejected


def _expand(name: str, taus: list[float], drafter: str | None) -> list[BenchConfig]:
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
        return [build(row, drafter, tau)]
    elif name in ROWS:
        rows = [ROWS[name]]
    else:
        raise ValueError(f"unknown configuration {name!r}; known: {', '.join(known_names())}")
    configs = []
    for row in rows:
        if row.per_tau:
            if not taus:
                raise ValueError(f"{row.name!r} is swept over tau but no tau values were given")
            configs.extend(build(row, drafter, tau) for tau in taus)
        else:
            configs.append(build(row, drafter))
    return configs
