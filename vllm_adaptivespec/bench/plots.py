"""PNG figures of a run: speed vs tau, accuracy vs tau (HumanEval pass@1, math exact match), speed against
accuracy recovery (one point per tau), and the distribution of chosen draft depths (one figure per histogram
the plugin exports).

One panel per (workload, batch, temperature). Swept rows are drawn as lines over tau; the point at
tau = 1 is the row's lossless twin (``policy-only`` for ``adaptive``, ``static-k4`` for ``margin-k4``), and
the other configurations are horizontal reference lines. ``speed_by_config`` shows every configuration
of a panel side by side (what a run with one tau, such as the tree preset, is read from).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .configs import TABLE
from .engine_metrics import histogram_distribution
from .report import accuracy_of

SWEPT = [row for row in TABLE if row.per_tau]
REFERENCE_STYLES = {"ar": ("black", ":"), "ngram": ("tab:brown", "-."), "suffix": ("tab:olive", "-."),
                    "dynamic": ("tab:purple", "--")}
# graded workload: (panel title, accuracy label); each gets its own figure
ACCURACY_PLOTS = {"humaneval": ("HumanEval", "pass@1"), "math": ("Math", "exact match"),
                  "edit": ("Code edits", "edit correct"), "quote": ("Quotes", "exact quote"),
                  "mixed": ("Mixed", "graded items correct")}
KIND_COLORS = {"ar": "tab:gray", "static": "tab:blue", "ngram": "tab:brown", "suffix": "tab:olive",
               "dynamic": "tab:purple", "static-tree": "tab:orange", "adaptivespec": "tab:green"}


def _groups(data: dict) -> dict[tuple, dict[str, dict]]:
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for cell in data["cells"]:
        if cell.get("status") == "ok":
            groups[(cell["workload"], cell["batch"], cell["temperature"])][cell["config"]] = cell
    return dict(sorted(groups.items()))


def _figure(n: int, max_cols: int = 4):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(n, max_cols)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return plt, fig, list(axes.flat[:n])


def _swept_cells(cells: dict[str, dict], row) -> list[tuple[float, dict]]:
    """A swept row's cells of one panel as (tau, cell), its lossless twin at tau 1."""
    points = [(c["tau"], c) for c in cells.values() if c.get("row") == row.name and c.get("tau") is not None]
    twin = cells.get(row.lossless_twin or "")
    return points + ([(1.0, twin)] if twin is not None else [])


def _tau_panel(ax, cells: dict[str, dict], value, ylabel: str) -> bool:
    """Swept rows as lines over tau plus reference lines; False when the panel has nothing."""
    drawn = False
    for row in SWEPT:
        points = sorted((t, value(c)) for t, c in _swept_cells(cells, row) if value(c) is not None)
        if points:
            ax.plot(*zip(*points), marker="o", label=row.name)
            drawn = True
    statics = [c for c in cells.values() if c.get("kind") == "static" and value(c) is not None]
    if statics:
        best = max(statics, key=lambda c: c["tokens_per_s"])
        ax.axhline(value(best), color="tab:green", linestyle="--", label=f"best static ({best['config']})")
        drawn = True
    for name, (color, style) in REFERENCE_STYLES.items():
        if name in cells and value(cells[name]) is not None:
            ax.axhline(value(cells[name]), color=color, linestyle=style, label=name)
            drawn = True
    ax.set_xlabel("tau (1 = lossless)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return drawn


def _save(plt, fig, axes, path: Path, title: str) -> Path:
    handles, labels = {}, []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
    fig.legend([handles[label] for label in labels], labels, loc="lower center", ncol=min(len(labels), 6),
               fontsize="small", bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return _write(plt, fig, path)


def _write(plt, fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speed_vs_tau(data: dict, path: Path) -> Path | None:
    groups = _groups(data)
    if not groups:
        return None
    plt, fig, axes = _figure(len(groups))
    drawn = False
    for ax, ((workload, batch, temp), cells) in zip(axes, groups.items()):
        drawn |= _tau_panel(ax, cells, lambda c: (c.get("derived") or {}).get("speedup_vs_ar"), "tok/s / AR tok/s")
        ax.set_title(f"{workload}, batch {batch}, T={temp:g}", fontsize="medium")
    if not drawn:
        plt.close(fig)
        return None
    return _save(plt, fig, axes, path, "Output tokens/s relative to autoregressive decoding")


def speed_by_config(data: dict, path: Path) -> Path | None:
    """Every configuration's tok/s per panel, labelled with x AR, acceptance length and draft tokens per step."""
    groups = _groups(data)
    if not groups:
        return None
    order = list(data.get("configs", {}))
    plt, fig, axes = _figure(len(groups), max_cols=2)
    for ax, ((workload, batch, temp), cells) in zip(axes, groups.items()):
        names = sorted(cells, key=lambda n: order.index(n) if n in order else len(order))[::-1]
        speeds = [cells[n]["tokens_per_s"] for n in names]
        ax.barh(names, speeds, color=[KIND_COLORS.get(cells[n].get("kind"), "tab:red") for n in names])
        for y, name in enumerate(names):
            cell = cells[name]
            vs_ar = (cell.get("derived") or {}).get("speedup_vs_ar")
            spec = cell.get("spec") or {}
            parts = [f"{vs_ar:.2f}x"] if vs_ar is not None else []
            if spec.get("mean_acceptance_length") is not None:
                parts.append(f"len {spec['mean_acceptance_length']:.1f}/{spec.get('draft_tokens_per_step') or 0:.1f}")
            label = " " + ", ".join(parts)
            ax.text(cell["tokens_per_s"], y, label, va="center", fontsize="x-small")
        ax.set_xlim(0, max(speeds) * 1.45)
        ax.set_xlabel("output tokens/s")
        ax.set_title(f"{workload}, batch {batch}, T={temp:g}", fontsize="medium")
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="y", labelsize="small")
    fig.text(0.5, 0.01, "labels: tok/s over AR, accepted length / draft tokens (tree nodes) per step", ha="center",
             fontsize="small")
    fig.suptitle("Output tokens/s by configuration")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    return _write(plt, fig, path)


def accuracy_vs_tau(data: dict, path: Path, workload: str = "humaneval") -> Path | None:
    """Accuracy over tau for one graded workload (HumanEval pass@1, math exact match, edits, quotes, mixed)."""
    title, label = ACCURACY_PLOTS[workload]
    groups = {k: v for k, v in _groups(data).items() if k[0] == workload}
    if not groups:
        return None
    plt, fig, axes = _figure(len(groups))
    drawn = False
    for ax, ((_, batch, temp), cells) in zip(axes, groups.items()):
        drawn |= _tau_panel(ax, cells, lambda c: accuracy_of(c).get("value"), label)
        ax.set_title(f"{title}, batch {batch}, T={temp:g}", fontsize="medium")
    if not drawn:
        plt.close(fig)
        return None
    return _save(plt, fig, axes, path, f"{title} {label}")


def speed_vs_accuracy(data: dict, path: Path) -> Path | None:
    """What the margin rule buys and costs: per graded panel, each swept row's points (one per tau, the
    lossless twin at tau 1) at x = tok/s over the run's best stock configuration (over AR where the run lacks
    the stock set) and y = accuracy recovery (accuracy / AR's), labelled with tau."""
    panels = {k: v for k, v in _groups(data).items() if any(accuracy_of(c) for c in v.values())}
    if not panels:
        return None
    plt, fig, axes = _figure(len(panels))
    drawn = False
    for ax, ((workload, batch, temp), cells) in zip(axes, panels.items()):
        stock = any((c.get("derived") or {}).get("speedup_vs_best_stock") is not None for c in cells.values())
        speed_key = "speedup_vs_best_stock" if stock else "speedup_vs_ar"
        for row in SWEPT:
            points = []
            for tau, cell in _swept_cells(cells, row):
                derived = cell.get("derived") or {}
                if derived.get(speed_key) is not None and derived.get("accuracy_recovery") is not None:
                    points.append((tau, derived[speed_key], derived["accuracy_recovery"]))
            if len(points) < 2:
                continue
            points.sort(reverse=True)  # lossless first, then lower taus
            line = ax.plot([p[1] for p in points], [p[2] for p in points], marker="o", label=row.name)[0]
            for tau, x, y in points:
                ax.annotate(f"{tau:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize="x-small",
                            color=line.get_color())
            drawn = True
        ax.axhline(1.0, color="black", linestyle=":", linewidth=0.8)
        ax.axvline(1.0, color="black", linestyle=":", linewidth=0.8)
        ax.set_xlabel("tok/s / best stock tok/s" if stock else "tok/s / AR tok/s")
        ax.set_ylabel("accuracy recovery")
        ax.set_title(f"{workload}, batch {batch}, T={temp:g}", fontsize="medium")
    if not drawn:
        plt.close(fig)
        return None
    return _save(plt, fig, axes, path, "Speed against accuracy, one point per tau")


def histogram_distribution_plot(data: dict, metric: str, path: Path) -> Path | None:
    """Share of request-steps in each bucket of one AdaptiveSpec histogram (``draft_depth``, ...)."""
    groups = {}
    for key, cells in _groups(data).items():
        found = {name: c["adaptivespec"][metric] for name, c in cells.items()
                 if ((c.get("adaptivespec") or {}).get(metric) or {}).get("count")}
        if found:
            groups[key] = found
    if not groups:
        return None
    what = metric.replace("_", " ")
    plt, fig, axes = _figure(len(groups))
    for ax, ((workload, batch, temp), hists) in zip(axes, groups.items()):
        for name, hist in hists.items():
            dist = [(float(le), count) for le, count in histogram_distribution(hist) if le != "+Inf"]
            total = sum(count for _, count in dist) or 1
            ax.plot([d for d, _ in dist], [count / total for _, count in dist], marker="o", label=name)
        ax.set_title(f"{workload}, batch {batch}, T={temp:g}", fontsize="medium")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel(what)
        ax.set_ylabel("share of request-steps")
        ax.grid(alpha=0.3)
    return _save(plt, fig, axes, path, f"AdaptiveSpec's {what} per request and step")


def _histogram_metrics(data: dict) -> list[str]:
    names = set()
    for cell in data["cells"]:
        for name, entry in (cell.get("adaptivespec") or {}).items():
            if isinstance(entry, dict) and entry.get("type") == "histogram":
                names.add(name)
    return sorted(names)


def draw_all(data: dict, directory: Path) -> list[Path]:
    made = [
        speed_by_config(data, directory / "speed_by_config.png"),
        speed_vs_tau(data, directory / "speed_vs_tau.png"),
        accuracy_vs_tau(data, directory / "pass_at_1_vs_tau.png", "humaneval"),
        accuracy_vs_tau(data, directory / "math_accuracy_vs_tau.png", "math"),
        *(accuracy_vs_tau(data, directory / f"{workload}_accuracy_vs_tau.png", workload)
          for workload in ("edit", "quote", "mixed")),
        speed_vs_accuracy(data, directory / "speed_vs_accuracy.png"),
        # draft_depth today; any histogram the plugin adds later (nodes, width) gets its own figure
        *(histogram_distribution_plot(data, metric, directory / f"{metric}_distribution.png")
          for metric in _histogram_metrics(data)),
    ]
    return [p for p in made if p is not None]


def load_figures(run: dict, path: Path) -> Path | None:
    """The serving-load run (`benchmarks/load.py`): tok/s, TTFT and ITL (p50 bars, p99 ticks) per configuration."""
    configs = run.get("configs") or {}
    if not configs:
        return None
    plt, fig, axes = _figure(3, max_cols=3)
    names = list(configs)
    panels = [("tokens_per_s", None, "output tok/s", 1.0), ("ttft_s", "p50", "time to first token (s)", 1.0),
              ("itl_s", "p50", "inter-chunk latency (ms)", 1000.0)]  # fmt: skip
    for ax, (key, _, label, scale) in zip(axes, panels):
        figures = [configs[n]["summary"][key] for n in names]
        if isinstance(figures[0], dict):
            p50 = [(f["p50"] or 0.0) * scale for f in figures]
            p99 = [(f["p99"] or 0.0) * scale for f in figures]
            ax.bar(names, p50, color="tab:blue", label="p50")
            ax.scatter(names, p99, color="tab:red", marker="_", s=400, label="p99")
        else:
            ax.bar(names, [f * scale for f in figures], color="tab:blue")
        ax.set_ylabel(label)
        ax.tick_params(axis="x", rotation=20)
        ax.grid(alpha=0.3, axis="y")
    return _save(plt, fig, axes, path, f"Serving load: {run.get('pair')}, {run.get('streams')} streams at once")
