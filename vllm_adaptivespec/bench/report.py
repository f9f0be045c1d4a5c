"""Figures computed across cells of one run, and the Markdown table.

Ratios compare cells of the same run and the same (workload, batch, temperature) only: the machine is
shared and noisy, so numbers from different runs are not comparable. A cell's figures are the medians
over its repeats (see `results.summarize`), so every ratio is one of medians; the paired table adds
each round's own ratio of a pinned row to its stock twin.
"""

from __future__ import annotations

import math
from collections import defaultdict

from .configs import STOCK_KINDS, STOCK_SET, TABLE
from .results import cell_key, median, repeats_of

# (pinned row, stock row of the same shape), compared side by side when both ran
PAIRS = tuple((row.name, row.stock_twin) for row in TABLE if row.stock_twin)
PAIR_RATIOS = ("step_p50_ratio", "tokens_per_s_ratio")  # pinned / stock, per pair and per round

DEFINITIONS = """\
- **tok/s**: generated tokens / wall-clock of the cell (all prompts, `batch` requests in flight, prefill included).
- **x AR**, **x best static**, **x best stock**: tok/s over the autoregressive target's, over the fastest
  static-k draft-model configuration's, and over the fastest stock vLLM speculation's in the same run,
  workload, batch and temperature; "best stock" is shown only when the run holds every stock
  configuration (static k = 1..4, n-gram, dynamic, and suffix decoding in a run that selected it: where Arctic
  Inference is not installed it is rejected and listed under "Configurations not run"), never for a subset.
- **sustained tok/s**, **sustained x AR**: where a cell of batch > 1 has more prompts than its batch, tokens /
  wall-clock of the steps taken while prompts were still waiting (the batch full, each finished request replaced
  at once), up to the step that prefills the last prompt: throughput at a steady load, as a server sees it,
  without the drain at the cell's end, where the batch shrinks to its slowest requests; and that over the
  autoregressive target's.
- **accept len**: mean tokens emitted per verification step (accepted draft tokens + 1), from vLLM's spec-decode counters.
- **draft/step**: draft tokens proposed per request and step (tree nodes, for tree configurations).
- **step p50/p99**: wall-clock of one engine iteration (`LLMEngine.step()`, one draft + verify round for all running
  requests), steps that prefilled a request left out.
- **accuracy**: HumanEval pass@1 (greedy or one sample; code run in a sandboxed subprocess), or for the math
  workload the exact-match share: the integer after the answer's last `Answer:` (else its last number) equals
  the generated problem's computed answer; for edit, the share of edited programs that pass the problem's
  HumanEval tests and make the asked change (annotations on every parameter and the return, the new name in place
  of the old, a docstring; for a planted bug passing the tests is the fix); for quote, the share of answers that
  contain the expected sentence of the passage verbatim; for mixed, the share of its graded items (edit, quote,
  HumanEval) correct by their own measure. The general workload is not graded (speed only): "–".
- **recovery**: accuracy / the autoregressive target's accuracy in the same cell (the lossless reference).
- **vs lossless**: a swept row's accuracy / its lossless twin's (``adaptive@0.5`` / ``policy-only``, ``margin-k4@t``
  / ``static-k4``) in the same cell, where both ran: in bf16 a lossless row drifts from the target alone at
  near-ties, so this isolates what the margin rule itself changed.
- **same as AR**: at temperature 0, share of answers token-identical to the autoregressive target's.
- **promoted**: draft tokens AdaptiveSpec's margin rule accepted that exact verification would have rejected.
- **free**: share of AdaptiveSpec's draft tokens copied from the requests' own text (the free source, no
  drafter pass), `vllm:adaptivespec_free_draft_tokens` / vLLM's draft-token counter.
- **passes/token**: drafter-model forward passes per generated token: AdaptiveSpec's own count
  (`vllm:adaptivespec_drafter_passes_total`: a step of copies only, or with speculation off, runs none);
  stock draft-model speculation at k runs k passes every engine step (k x steps / tokens); n-gram, suffix
  and the autoregressive target run none. The drafter passes free drafts save show as AdaptiveSpec's
  figure below stock's at a similar acceptance length.
- **repeats**: with `--repeats N` every configuration runs N interleaved rounds (A B C A B C); each figure is the
  median over the rounds, and **tok/s spread** / **p50 spread** are max/min - 1 over them (min and max in results.json).
- **overhead**: for configurations running the plugin, seconds it spent in its own per-step work
  (`vllm:adaptivespec_overhead_seconds_total`) / the wall-clock of all the cell's steps, prefill steps included.
"""


# Metrics the report shows as accuracy. Results of earlier versions graded the general workload's few word
# problems by their last number ("word_problem_accuracy"); that measured nothing and is not shown.
ACCURACY_METRICS = ("pass@1", "exact_match", "edit_correct", "quote_exact", "mixed_correct")


def accuracy_of(cell: dict) -> dict:
    """The cell's accuracy record, or {} when it has none the report shows."""
    accuracy = cell.get("accuracy") or {}
    return accuracy if accuracy.get("metric", "pass@1") in ACCURACY_METRICS else {}


def _group(cell: dict) -> tuple:
    return (cell["workload"], cell["batch"], cell["temperature"])


def _ratio(a, b):
    return a / b if a is not None and b else None


def stock_set(data: dict) -> set[str]:
    """The stock configurations a best-stock figure needs: every one in `STOCK_SET`, plus any other stock
    configuration this run selected (suffix decoding where Arctic Inference is installed; where it is not, the
    row was rejected at selection and is listed under "Configurations not run")."""
    selected = {name for name, config in (data.get("configs") or {}).items() if config.get("kind") in STOCK_KINDS}
    return set(STOCK_SET) | selected


LOSSLESS_TWINS = {row.name: row.lossless_twin for row in TABLE if row.lossless_twin}


def derive(data: dict) -> None:
    """Add each cell's ``derived`` figures (ratios to AR / best static k / best stock, accuracy recovery)
    and the run's ``paired`` comparisons."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for cell in data["cells"]:
        if cell.get("status") == "ok":
            groups[_group(cell)].append(cell)
    for cell in data["cells"]:
        cell.pop("derived", None)
    for cells in groups.values():
        ar = next((c for c in cells if c["config"] == "ar"), None)
        statics = [c for c in cells if c.get("kind") == "static"]
        best = max(statics, key=lambda c: c["tokens_per_s"], default=None)
        stock = [c for c in cells if c.get("kind") in STOCK_KINDS]
        complete = stock_set(data) <= {c["config"] for c in stock}
        best_stock = max(stock, key=lambda c: c["tokens_per_s"], default=None) if complete else None
        ar_accuracy = accuracy_of(ar).get("value") if ar else None
        by_config = {c["config"]: c for c in cells}
        for cell in cells:
            accuracy = accuracy_of(cell).get("value")
            twin = by_config.get(LOSSLESS_TWINS.get(cell.get("row")) or "")
            cell["derived"] = {
                "speedup_vs_ar": _ratio(cell["tokens_per_s"], ar and ar["tokens_per_s"]),
                "sustained_vs_ar": _ratio(_sustained(cell), ar and _sustained(ar)),
                "speedup_vs_best_static": _ratio(cell["tokens_per_s"], best and best["tokens_per_s"]),
                "best_static": best["config"] if best else None,
                "speedup_vs_best_stock": _ratio(cell["tokens_per_s"], best_stock and best_stock["tokens_per_s"]),
                "best_stock": best_stock["config"] if best_stock else None,
                "accuracy_recovery": _ratio(accuracy, ar_accuracy),
                # a swept row against its own lossless twin (adaptive@0.5 against policy-only), where both ran
                "accuracy_vs_lossless": _ratio(accuracy, accuracy_of(twin).get("value")) if twin else None,
            }
    data["paired"] = paired(data)


def _sustained(cell: dict) -> float | None:
    """The cell's sustained tok/s (the median over its repeats), None where it had no steady stretch or runs one
    request at a time (batch 1 has no drain to leave out: its window would only drop the last prompt)."""
    if cell.get("batch", 1) <= 1:
        return None
    return (cell.get("sustained") or {}).get("tokens_per_s")


def _step_p50(figures: dict):
    return (figures.get("step_latency_ms") or {}).get("p50")


def _pair_ratios(mine: dict, theirs: dict) -> dict:
    """Pinned / stock step p50 and tok/s (``PAIR_RATIOS``) of two cells, or of two repeats of them."""
    return {"step_p50_ratio": _ratio(_step_p50(mine), _step_p50(theirs)),
            "tokens_per_s_ratio": _ratio(mine.get("tokens_per_s"), theirs.get("tokens_per_s"))}


def paired(data: dict) -> list[dict]:
    """Each pinned row against its stock twin in every (workload, batch, temperature) where both were
    measured: ratios of the medians, and per round (the two ran back to back) with their median."""
    cells = {cell_key(c): c for c in data["cells"] if c.get("status") == "ok"}
    out = []
    for key in sorted({_group(c) for c in cells.values()}):
        for config, twin in PAIRS:
            mine, theirs = cells.get((config, *key)), cells.get((twin, *key))
            if mine is None or theirs is None:
                continue
            their_rounds = {r["repeat"]: r for r in repeats_of(theirs) if r.get("status") == "ok"}
            rounds = [{"repeat": r["repeat"], **_pair_ratios(r, their_rounds[r["repeat"]])}
                      for r in repeats_of(mine) if r.get("status") == "ok" and r["repeat"] in their_rounds]
            out.append({"config": config, "twin": twin, "workload": key[0], "batch": key[1], "temperature": key[2],
                        **_pair_ratios(mine, theirs), "rounds": rounds,
                        "round_median": {k: median([r[k] for r in rounds]) for k in PAIR_RATIOS},
                        "overhead_share": mine.get("overhead_share")})
    return out


def _fmt(value, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}{suffix}"


def _pct(value, digits: int = 0) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def _spread(cell: dict, figure: str) -> str:
    return _pct(((cell.get("spread") or {}).get(figure) or {}).get("rel"), 1)


def _row(cell: dict) -> dict[str, str]:
    """The cell's entry in every column (`columns` picks those the run has)."""
    if cell.get("status") != "ok":
        problem = f"**{cell.get('status', '?')}**: {_short(cell.get('error', ''))}"
        return {"config": f"`{cell['config']}`", "tok/s": problem}
    derived = cell.get("derived", {})
    spec = cell.get("spec", {})
    latency = cell.get("step_latency_ms", {})
    accuracy = accuracy_of(cell)
    match = cell.get("match_vs_ar") or {}
    promoted = (cell.get("adaptivespec") or {}).get("promoted_tokens", {}).get("value")
    free = _plugin_count(cell, "free_draft_tokens")
    draft_tokens = spec.get("num_draft_tokens")
    return {
        "config": f"`{cell['config']}`",
        "tok/s": _fmt(cell["tokens_per_s"], 1),
        "tok/s spread": _spread(cell, "tokens_per_s"),
        "x AR": _fmt(derived.get("speedup_vs_ar"), 2, "x"),
        "x best static": _fmt(derived.get("speedup_vs_best_static"), 2, "x"),
        "x best stock": _fmt(derived.get("speedup_vs_best_stock"), 2, "x"),
        "sustained tok/s": _fmt(_sustained(cell), 1),
        "sustained x AR": _fmt(derived.get("sustained_vs_ar"), 2, "x"),
        "accept len": _fmt(spec.get("mean_acceptance_length"), 2),
        "draft/step": _fmt(spec.get("draft_tokens_per_step"), 2),
        "step p50 ms": _fmt(latency.get("p50"), 1),
        "p50 spread": _spread(cell, "step_p50_ms"),
        "step p99 ms": _fmt(latency.get("p99"), 1),
        "accuracy": _pct(accuracy.get("value")) + (f" ({accuracy['correct']}/{accuracy['n']})" if accuracy else ""),
        "recovery": _pct(derived.get("accuracy_recovery")),
        "vs lossless": _pct(derived.get("accuracy_vs_lossless")),
        "same as AR": _pct(match.get("identical")),
        "promoted": "–" if promoted is None else f"{promoted:g}",
        "free": _pct(free / draft_tokens) if free is not None and draft_tokens else "–",
        "passes/token": _fmt(passes_per_token(cell), 2),
        "overhead": _pct(cell.get("overhead_share"), 1),
    }


def _plugin_count(cell: dict, name: str) -> float | None:
    """A counter of the plugin's (``vllm:adaptivespec_<name>``) where the cell ran it; stock rows export the
    plugin's counters too (installed, not asked for), at zero, which says nothing about them."""
    if cell.get("kind") not in ("adaptivespec", "static-tree"):
        return None
    return ((cell.get("adaptivespec") or {}).get(name) or {}).get("value")


def passes_per_token(cell: dict) -> float | None:
    """Drafter-model forward passes per generated token (**passes/token** in the module docstring); None
    where the run does not tell (vLLM's batch-size schedule changes k from step to step)."""
    tokens = cell.get("output_tokens")
    counted = _plugin_count(cell, "drafter_passes")
    if not tokens:
        return None
    if counted is not None:
        return counted / tokens
    if cell.get("kind") in ("ar", "ngram", "suffix"):
        return 0.0
    steps = cell.get("step_latency_ms") or {}
    if cell.get("kind") == "static" and cell.get("depth") and "decode_steps" in steps:
        return cell["depth"] * (steps["decode_steps"] + steps.get("prefill_steps", 0)) / tokens
    return None


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


HEADER = ["config", "tok/s", "x AR", "x best static", "x best stock", "sustained tok/s", "sustained x AR",
          "accept len", "draft/step", "step p50 ms", "step p99 ms", "accuracy", "recovery", "vs lossless",
          "same as AR", "promoted", "free", "passes/token"]


def columns(data: dict) -> list[str]:
    """`HEADER`, plus the spreads when some cell has several measured repeats and the overhead share when
    some cell recorded one (None included: the plugin ran but exported no overhead counter); the free share
    only when some cell's plugin counted free draft tokens, passes per token when it counted drafter passes, the
    sustained figures when some cell of batch > 1 had more prompts than its batch."""
    header = list(HEADER)
    cells = [c for c in data["cells"] if c.get("status") == "ok"]
    if not any((c.get("derived") or {}).get("best_stock") for c in cells):
        header.remove("x best stock")  # the run lacks part of the stock set: no "best stock" to speak of
    if not any((c.get("derived") or {}).get("accuracy_vs_lossless") is not None for c in cells):
        header.remove("vs lossless")  # no swept row ran beside its lossless twin
    if not any(_sustained(c) for c in cells):
        header.remove("sustained tok/s")  # no cell of batch > 1 had more prompts than its batch
        header.remove("sustained x AR")
    if not any("free_draft_tokens" in (c.get("adaptivespec") or {}) for c in cells):
        header.remove("free")
    if not any("drafter_passes" in (c.get("adaptivespec") or {}) for c in cells):
        header.remove("passes/token")  # results from before the plugin counted its drafter passes
    if any((c.get("n_repeats") or 1) > 1 for c in cells):
        header.insert(header.index("tok/s") + 1, "tok/s spread")
        header.insert(header.index("step p50 ms") + 1, "p50 spread")
    if any("overhead_share" in c for c in cells):
        header.append("overhead")
    return header


def markdown(data: dict) -> str:
    env = data.get("environment", {})
    hw = env.get("hardware", {})
    models = data.get("models", {})
    settings = data.get("settings", {})
    lines = [
        "# AdaptiveSpec benchmark",
        "",
        f"- command: `{data.get('command', '')}`",
        f"- started {data.get('started', '')}, updated {data.get('updated', '')}",
        f"- vLLM {env.get('vllm')} ({env.get('vllm_distribution')}), torch {env.get('torch')}, "
        f"vllm-adaptivespec {env.get('vllm_adaptivespec')}",
        f"- hardware: {hw.get('cpu')}, {hw.get('cpu_cores_usable')} usable cores, {hw.get('memory_gib')} GiB"
        + (f", GPUs: {', '.join(hw['gpus'])}" if hw.get("gpus") else ", no GPU"),
        f"- models ({models.get('pair') or 'explicit paths'}): target `{models.get('target')}`, "
        f"drafter `{models.get('drafter')}`",
        f"- mode {settings.get('mode')}: max tokens {settings.get('max_tokens')}, "
        f"max_model_len {settings.get('max_model_len')}, enforce_eager {settings.get('enforce_eager')}, "
        f"repeats {settings.get('repeats', 1)}",
        "",
        DEFINITIONS,
    ]
    rejected = data.get("rejected_configs") or []
    if rejected:
        lines += ["## Configurations not run", ""]
        lines += [f"- `{r['name']}`: {_short(r['reason'], 400)}" for r in rejected]
        lines.append("")
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for cell in data["cells"]:
        groups[_group(cell)].append(cell)
    order = list(data.get("configs", {}))
    header = columns(data)
    for (workload, batch, temperature), cells in sorted(groups.items()):
        cells.sort(key=lambda c: order.index(c["config"]) if c["config"] in order else len(order))
        lines += [f"## {workload}, batch {batch}, temperature {temperature:g}", ""]
        lines += _table(header, [[_row(cell).get(column, "") for column in header] for cell in cells])
    lines += _paired_table(data.get("paired") or [])
    lines += _paired_accuracy_table(data)
    lines += _hindsight_table(data)
    lines += _plugin_notes(data)
    lines += _repeat_notes(data)
    return "\n".join(lines).rstrip() + "\n"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows), ""]


def _rounds(pair: dict, figure: str) -> str:
    values = [_fmt(r[figure], 3) for r in pair["rounds"]]
    if len(values) < 2:
        return ", ".join(values) or "–"
    return ", ".join(values) + f" (median {_fmt(pair['round_median'][figure], 3)})"


def _paired_table(pairs: list[dict]) -> list[str]:
    """Pinned AdaptiveSpec against stock speculation of the same shape: the plugin's own cost."""
    if not pairs:
        return []
    rows = [[p["workload"], str(p["batch"]), f"{p['temperature']:g}", f"`{p['config']}` / `{p['twin']}`",
             _fmt(p["step_p50_ratio"], 3), _rounds(p, "step_p50_ratio"),
             _fmt(p["tokens_per_s_ratio"], 3), _rounds(p, "tokens_per_s_ratio"), _pct(p["overhead_share"], 1)]
            for p in pairs]
    return ["## Pinned AdaptiveSpec vs stock speculation of the same shape", "",
            "Pinned / stock: step p50 and tok/s ratios of the medians over rounds, then each round's ratio (the two "
            "run back to back in every round, so a round's ratio is the less noisy figure). A step p50 ratio above "
            "1 is what running the plugin adds to a step; overhead is the pinned row's share of step time in its own work.", "",
            *_table(["workload", "batch", "T", "pinned / stock", "step p50 ratio", "per round", "tok/s ratio",
                     "per round", "overhead"], rows)]


def mcnemar_p(only_first: int, only_second: int) -> float:
    """Exact two-sided McNemar test: the chance, with no difference between two paired classifiers, of a split
    of the discordant pairs at least this uneven (binomial, n = only_first + only_second, p = 1/2)."""
    n, k = only_first + only_second, min(only_first, only_second)
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n)


def paired_accuracy(data: dict) -> list[dict]:
    """Each graded row against the target alone (``ar``) and against its lossless twin, problem by problem, in
    every (workload, batch, temperature) where both ran on the same problems: how many problems only the
    reference got right, how many only this row did, and the exact McNemar p of that split. A cell's wrong
    answers are the keys of its accuracy record's ``failures``."""
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for cell in data["cells"]:
        if cell.get("status") == "ok" and "failures" in accuracy_of(cell):
            groups[_group(cell)][cell["config"]] = cell
    pairs = []
    for (workload, batch, temperature), cells in sorted(groups.items()):
        for name, cell in cells.items():
            references = ["ar", LOSSLESS_TWINS.get(cell.get("row"))]
            for reference in dict.fromkeys(r for r in references if r and r != name and r in cells):
                theirs, mine = accuracy_of(cells[reference]), accuracy_of(cell)
                if theirs["n"] != mine["n"]:
                    continue
                only_reference = len(set(mine["failures"]) - set(theirs["failures"]))
                only_mine = len(set(theirs["failures"]) - set(mine["failures"]))
                pairs.append({"workload": workload, "batch": batch, "temperature": temperature, "config": name,
                              "reference": reference, "n": mine["n"], "only_reference": only_reference,
                              "only_config": only_mine, "p": mcnemar_p(only_reference, only_mine)})
    return pairs


def _paired_accuracy_table(data: dict) -> list[str]:
    pairs = paired_accuracy(data)
    if not pairs:
        return []
    rows = [[p["workload"], str(p["batch"]), f"{p['temperature']:g}", f"`{p['config']}` / `{p['reference']}`",
             str(p["n"]), str(p["only_reference"]), str(p["only_config"]), f"{p['p']:.3g}"] for p in pairs]
    return ["## Paired accuracy", "",
            "Problem by problem against the target alone and against the row's lossless twin: problems only the "
            "reference answered right, only this row did, and the exact two-sided McNemar p of that split (a small p: "
            "the difference is unlikely to be chance).", "",
            *_table(["workload", "batch", "T", "row / reference", "problems", "only reference right",
                     "only row right", "McNemar p"], rows)]


def _hindsight_table(data: dict) -> list[str]:
    """The policy against the best fixed depth and a per-step oracle, from the cell's own step records."""
    cells = [c for c in data["cells"] if c.get("status") == "ok" and c.get("hindsight")]
    if not cells:
        return []
    rows = [[c["workload"], str(c["batch"]), f"{c['temperature']:g}", f"`{c['config']}`",
             _fmt(c["hindsight"]["policy"], 1),
             f"{_fmt(c['hindsight']['best_fixed'], 1)} (k={c['hindsight']['best_fixed_depth']:g})",
             _fmt(c["hindsight"]["oracle"], 1), _pct(c["hindsight"]["regret"], 1)]
            for c in cells]
    return ["## Policy vs hindsight", "",
            "Tokens/s of the policy's own steps, of the best fixed depth and of a per-step oracle that knew each "
            "draft's outcome, all priced by the engine's fitted step costs (`step_cost.hindsight`; a fully "
            "accepted draft is credited no more for deeper chains, so deeper fixed depths are lower bounds). "
            "Regret = 1 - policy / oracle.", "",
            *_table(["workload", "batch", "T", "config", "policy", "best fixed", "oracle", "regret"], rows)]


def _plugin_notes(data: dict) -> list[str]:
    """Flag AdaptiveSpec configurations whose engine exported no AdaptiveSpec depth observations."""
    silent = sorted({
        c["config"] for c in data["cells"]
        if c.get("status") == "ok" and c.get("kind") == "adaptivespec"
        and not ((c.get("adaptivespec") or {}).get("draft_depth") or {}).get("count")
    })
    if not silent:
        return []
    return ["## Warnings", "",
            "AdaptiveSpec configurations that recorded no `vllm:adaptivespec_draft_depth` observations "
            "(plugin not active, or its metrics missing): " + ", ".join(f"`{n}`" for n in silent), ""]


def _repeat_notes(data: dict) -> list[str]:
    """Repeats of measured cells that did not complete (their cell's figures are over the others)."""
    missing = [f"- `{c['config']}` {c['workload']}, batch {c['batch']}, temperature {c['temperature']:g}, "
               f"round {r['repeat'] + 1}: {r.get('status')}: {_short(r.get('error', ''))}"
               for c in data["cells"] if c.get("status") == "ok"
               for r in repeats_of(c) if r.get("status") != "ok"]
    if not missing:
        return []
    return ["## Repeats not measured", "", "Figures of these cells are over their other rounds.", "", *missing, ""]
