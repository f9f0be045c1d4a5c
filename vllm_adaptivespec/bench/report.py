"""Figures computed across cells of one run, and the Markdown table.

Ratios compare cells of the same run and the same (workload, batch, temperature) only: the machine is
shared and noisy, so numbers from different runs are not comparable.
"""

from __future__ import annotations

from collections import defaultdict

from .configs import STOCK_KINDS

DEFINITIONS = """\
- **tok/s**: generated tokens / wall-clock of the cell (all prompts, `batch` requests in flight, prefill included).
- **x AR**, **x best static**, **x best stock**: tok/s over the autoregressive target's, over the fastest
  static-k draft-model configuration's, and over the fastest stock vLLM speculation's (static k, n-gram,
  dynamic), in the same run, workload, batch and temperature.
- **accept len**: mean tokens emitted per verification step (accepted draft tokens + 1), from vLLM's spec-decode counters.
- **draft/step**: draft tokens proposed per request and step (tree nodes, for tree configurations).
- **step p50/p99**: wall-clock of one engine iteration (`LLMEngine.step()`, one draft + verify round for all running
  requests), steps that prefilled a request left out.
- **accuracy**: HumanEval pass@1 (greedy or one sample; code run in a sandboxed subprocess), or for the general
  workload the share of word problems whose last number is the expected answer.
- **recovery**: accuracy / the autoregressive target's accuracy in the same cell (the lossless reference).
- **same as AR**: at temperature 0, share of answers token-identical to the autoregressive target's.
- **promoted**: draft tokens AdaptiveSpec's margin rule accepted that exact verification would have rejected.
"""


def _group(cell: dict) -> tuple:
    return (cell["workload"], cell["batch"], cell["temperature"])


def _ratio(a, b):
    return a / b if a is not None and b else None


def derive(data: dict) -> None:
    """Add each cell's ``derived`` figures (ratios to AR / best static k / best stock, accuracy recovery)."""
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
        best_stock = max(stock, key=lambda c: c["tokens_per_s"], default=None)
        ar_accuracy = (ar.get("accuracy") or {}).get("value") if ar else None
        for cell in cells:
            accuracy = (cell.get("accuracy") or {}).get("value")
            cell["derived"] = {
                "speedup_vs_ar": _ratio(cell["tokens_per_s"], ar and ar["tokens_per_s"]),
                "speedup_vs_best_static": _ratio(cell["tokens_per_s"], best and best["tokens_per_s"]),
                "best_static": best["config"] if best else None,
                "speedup_vs_best_stock": _ratio(cell["tokens_per_s"], best_stock and best_stock["tokens_per_s"]),
                "best_stock": best_stock["config"] if best_stock else None,
                "accuracy_recovery": _ratio(accuracy, ar_accuracy),
            }


def _fmt(value, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}{suffix}"


def _pct(value) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _row(cell: dict) -> list[str]:
    if cell.get("status") != "ok":
        problem = f"**{cell.get('status', '?')}**: {_short(cell.get('error', ''))}"
        return [f"`{cell['config']}`", problem] + [""] * (len(HEADER) - 2)
    derived = cell.get("derived", {})
    spec = cell.get("spec", {})
    latency = cell.get("step_latency_ms", {})
    accuracy = cell.get("accuracy") or {}
    match = cell.get("match_vs_ar") or {}
    promoted = (cell.get("adaptivespec") or {}).get("promoted_tokens", {}).get("value")
    return [
        f"`{cell['config']}`",
        _fmt(cell["tokens_per_s"], 1),
        _fmt(derived.get("speedup_vs_ar"), 2, "x"),
        _fmt(derived.get("speedup_vs_best_static"), 2, "x"),
        _fmt(derived.get("speedup_vs_best_stock"), 2, "x"),
        _fmt(spec.get("mean_acceptance_length"), 2),
        _fmt(spec.get("draft_tokens_per_step"), 2),
        _fmt(latency.get("p50"), 1),
        _fmt(latency.get("p99"), 1),
        _pct(accuracy.get("value")) + (f" ({accuracy['correct']}/{accuracy['n']})" if accuracy else ""),
        _pct(derived.get("accuracy_recovery")),
        _pct(match.get("identical")),
        "–" if promoted is None else str(promoted),
    ]


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


HEADER = ["config", "tok/s", "x AR", "x best static", "x best stock", "accept len", "draft/step", "step p50 ms",
          "step p99 ms", "accuracy", "recovery", "same as AR", "promoted"]


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
        f"max_model_len {settings.get('max_model_len')}, enforce_eager {settings.get('enforce_eager')}",
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
    for (workload, batch, temperature), cells in sorted(groups.items()):
        cells.sort(key=lambda c: order.index(c["config"]) if c["config"] in order else len(order))
        lines += [f"## {workload}, batch {batch}, temperature {temperature:g}", ""]
        lines.append("| " + " | ".join(HEADER) + " |")
        lines.append("|" + "---|" * len(HEADER))
        lines += ["| " + " | ".join(_row(cell)) + " |" for cell in cells]
        lines.append("")
    lines += _plugin_notes(data)
    return "\n".join(lines).rstrip() + "\n"


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
