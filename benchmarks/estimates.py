"""How well does the step plan's acceptance estimate predict what the target accepts?

The plan prices every drafted token at a per-position acceptance estimate (``AdaptiveState.acceptance_estimates``):

    p = w * cal(c) + (1 - w) * a       c  the drafter's top-1 confidence for that token
                                       cal(c)  what tokens of that confidence earned (``ConfidenceCalibration``)
                                       a  the request's rolling acceptance, shrunk toward the pool
                                       w  ``confidence_weight``

This runs one AdaptiveSpec engine in-process over a workload, records for every drafted token its c, cal(c)
and a as the plan read them and whether the target accepted it, and scores rival estimates on the tokens
that were judged (a token after a rejected one is never judged): Brier score, log loss, and the resulting
fit of w. Copied tokens (free drafts) are scored too: the plan's f (a copy's first token) and c (a later one,
given the one before it held) against one per-position rate for all of them (``engine/free_draft.py``).
A better estimate ranks the tokens worth a pass better, which is what the plan's choices rest on.

    python benchmarks/estimates.py --config policy-only --workloads general,humaneval \\
        --output benchmarks/results/estimates-qwen-coder

Writes results.json (every record, reliability tables), results.md and reliability.png (per workload: accepted
fraction against the estimate, binned, for cal(c) and for a; Brier score against w) under --output; ``--replot``
writes the last two again from a saved results.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the hooks below live in this process's runner


def install_recorder(worker, sink_name: str) -> None:
    """Runs in the worker: wraps the runner's ``AdaptiveState`` so that every drafted token's (c, cal(c), a)
    and its verdict land in the list ``worker.<sink_name>``."""
    state = worker.model_runner.adaptivespec
    records: list[dict] = []
    setattr(worker, sink_name, records)
    pending: dict[str, list[tuple[float, float, float]]] = {}
    choose, cont, verifying = state.choose_shapes, state.continue_chains, state.verifying

    def read(rid: str, c: float, pooled) -> tuple[float, float, float]:
        return (float(c), float(state.calibration(float(c))), float(state._history(rid, pooled)))

    def choose_shapes(confidence, node_ceiling):
        pooled = state.pooled.rate()
        pending.clear()
        for rid, c in zip(state.request_ids(), confidence.tolist()):
            pending[rid] = [read(rid, c, pooled)]
        return choose(confidence, node_ceiling)

    def continue_chains(confidence):
        pooled = state.pooled.rate()
        for rid, c in zip(state.request_ids(), confidence):
            if rid in pending:
                pending[rid].append(read(rid, c, pooled))
        return cont(confidence)

    @contextmanager
    def verifying_(num_draft_tokens, trees=None):
        req_ids = state.request_ids()
        with verifying(num_draft_tokens, trees) as done:
            yield done
            if done.num_accepted is not None:
                for rid, drafted, accepted in zip(req_ids, done.num_draft_tokens, done.num_accepted):
                    tokens = pending.pop(rid, [])
                    if not drafted or len(tokens) < drafted:  # a free draft, or a chain not from the drafter
                        continue
                    for k, (c, cal, hist) in enumerate(tokens[:drafted], start=1):
                        if k > accepted + 1:
                            break  # after a rejection: never judged
                        records.append({"k": k, "c": c, "cal": cal, "a": hist, "accepted": k <= accepted})

    state.choose_shapes, state.continue_chains, state.verifying = choose_shapes, continue_chains, verifying_
    copies = state.free_drafts
    if copies is None:
        return
    # Copies (free drafts): every judged copied token's estimate as the plan read it, f for the first token and c
    # for a later one (its chance given the one before it held), and whether it held.
    copy_records: list[dict] = []
    setattr(worker, sink_name + "_copies", copy_records)
    read_copies: dict[str, tuple[float, float]] = {}
    estimates, judged = copies.estimates, copies.judged

    def estimates_(req_ids):
        out = estimates(req_ids)
        read_copies.update({rid: (f, c) for rid, (n, f, c) in zip(req_ids, out) if n})
        return out

    def judged_(rid, accepted_nodes):
        branch = judged(rid, accepted_nodes)
        if branch is not None and rid in read_copies:
            f, c = read_copies[rid]
            held = branch.held(accepted_nodes)
            for k in range(1, min(len(branch.path), held + 1) + 1):  # a token after a failed one is never judged
                copy_records.append({"k": k, "estimate": f if k == 1 else c, "accepted": k <= held})
        return branch

    copies.estimates, copies.judged = estimates_, judged_


def take_records(worker, sink_name: str) -> list[dict]:
    records = list(getattr(worker, sink_name, []))
    getattr(worker, sink_name, []).clear()
    return records


def score_copies(records: list[dict]) -> dict | None:
    """Copied tokens, each judged given the one before it held: Brier score of the plan's estimate (f for a first
    token, c for a later one) against one per-position rate for every copied token (the run's own mean: the best
    constant, so a lower bound for any single rate), per subset."""
    if not records:
        return None
    out = {"tokens": len(records)}
    rate = sum(r["accepted"] for r in records) / len(records)
    for subset, sel in (("all", records), ("first", [r for r in records if r["k"] == 1]),
                        ("later", [r for r in records if r["k"] > 1])):
        if sel:
            y = [r["accepted"] for r in sel]
            out[subset] = {"tokens": len(sel), "accepted": sum(y) / len(y),
                           "mean_estimate": sum(r["estimate"] for r in sel) / len(sel),
                           "brier_plan": brier([r["estimate"] for r in sel], y), "brier_one_rate": brier([rate] * len(y), y)}
    return out


def brier(p: list[float], y: list[bool]) -> float:
    return sum((pi - yi) ** 2 for pi, yi in zip(p, y)) / len(y)


def log_loss(p: list[float], y: list[bool]) -> float:
    eps = 1e-4
    return -sum(math.log(min(1 - eps, max(eps, pi)) if yi else 1 - min(1 - eps, max(eps, pi)))
                for pi, yi in zip(p, y)) / len(y)


def fitted_weight(records: list[dict]) -> float:
    """w minimising sum (y - (w cal + (1 - w) a))^2, clipped to [0, 1]."""
    num = sum((r["accepted"] - r["a"]) * (r["cal"] - r["a"]) for r in records)
    den = sum((r["cal"] - r["a"]) ** 2 for r in records)
    return min(1.0, max(0.0, num / den)) if den > 0 else 0.5


def score(records: list[dict]) -> dict:
    y = [r["accepted"] for r in records]
    rows = {}
    for w in (0.0, 0.25, 0.5, 0.75, 1.0):
        p = [w * r["cal"] + (1 - w) * r["a"] for r in records]
        rows[f"w={w:g}"] = {"brier": brier(p, y), "log_loss": log_loss(p, y)}
    p = [r["c"] for r in records]
    rows["raw confidence"] = {"brier": brier(p, y), "log_loss": log_loss(p, y)}
    base = sum(y) / len(y)
    rows["constant (the mean)"] = {"brier": brier([base] * len(y), y), "log_loss": log_loss([base] * len(y), y)}
    return {"tokens": len(records), "accepted": base, "fitted_w": fitted_weight(records), "estimates": rows}


def reliability(records: list[dict], key: str, bins: int = 10) -> list[dict]:
    out = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        sel = [r for r in records if lo <= r[key] < hi or (b == bins - 1 and r[key] == 1.0)]
        if sel:
            out.append({"bin": [lo, hi], "n": len(sel), "mean_estimate": sum(r[key] for r in sel) / len(sel),
                        "accepted": sum(r["accepted"] for r in sel) / len(sel)})
    return out


def render(result: dict) -> str:
    """results.md: one row per workload and subset, Brier / log loss of every estimate."""
    names = next((list(d["all"]["estimates"]) for d in result["workloads"].values() if d["all"]), [])
    lines = ["# Acceptance estimates against verdicts", "", f"- command: `{result['command']}`",
             f"- config `{result['config']}`, batch {result['batch']}, {result['environment']['hardware']['cpu']}",
             "", "Scores over judged drafted tokens (lower is better); w: weight of cal(c) against the request's "
             "history; fitted w: least squares over the same tokens.", "",
             "| workload | tokens | subset | accepted | fitted w | " + " | ".join(names) + " |",
             "|---|---|---|---|---|" + "---|" * len(names)]
    for workload, data in result["workloads"].items():
        for subset in ("all", "first", "later"):
            s = data[subset]
            if not s:
                continue
            cells = " | ".join(f"{v['brier']:.4f} / {v['log_loss']:.3f}" for v in s["estimates"].values())
            lines.append(f"| {workload} | {s['tokens']} | {subset} | {s['accepted']:.3f} | {s['fitted_w']:.2f} | "
                         f"{cells} |")
    lines += ["", "Cells: Brier / log loss."]
    copies = {w: d["copies"] for w, d in result["workloads"].items() if d.get("copies")}
    if copies:
        lines += ["", "## Copies (free drafts)", "",
                  "Every judged copied token, given the one before it held: the plan's estimate (f for the first token "
                  "of a copy, c for a later one) against one per-position rate for every copied token (the run's mean).",
                  "", "| workload | subset | tokens | accepted | mean estimate | Brier, plan | Brier, one rate |",
                  "|---|---|---|---|---|---|---|"]
        for workload, c in copies.items():
            for subset in ("all", "first", "later"):
                if subset in c:
                    s = c[subset]
                    lines.append(f"| {workload} | {subset} | {s['tokens']} | {s['accepted']:.3f} | "
                                 f"{s['mean_estimate']:.3f} | {s['brier_plan']:.4f} | {s['brier_one_rate']:.4f} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, output: Path) -> None:
    """reliability.png: per workload, the accepted fraction of each estimate's bins (point size ~ tokens; the
    drafter's cal(c) and a, and the copies' f and c), and the Brier score of p = w cal(c) + (1 - w) a over w."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = result["workloads"]
    fig, axes = plt.subplots(2, len(workloads), figsize=(4.5 * len(workloads), 8), squeeze=False)
    for col, (workload, data) in enumerate(workloads.items()):
        ax = axes[0][col]
        ax.plot([0, 1], [0, 1], color="gray", lw=0.8)
        series = [("reliability_cal", "cal(c)", "tab:blue"), ("reliability_a", "history a", "tab:orange")]
        if data.get("copy_records"):
            data = {**data, "reliability_copies": reliability(data["copy_records"], "estimate")}
            series.append(("reliability_copies", "copies: f, c", "tab:green"))
        tokens = (data["all"]["tokens"] if data["all"] else 0) + len(data.get("copy_records") or [])
        for key, label, color in series:
            bins = data[key]
            ax.plot([b["mean_estimate"] for b in bins], [b["accepted"] for b in bins], "-o", color=color, label=label,
                    lw=1, markersize=0)
            ax.scatter([b["mean_estimate"] for b in bins], [b["accepted"] for b in bins], color=color,
                       s=[8 + 200 * b["n"] / tokens for b in bins])
        ax.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="estimate (bin mean)", ylabel="accepted fraction",
               title=f"{workload}: {tokens} judged tokens")
        ax.legend(loc="upper left", fontsize=8)
        ax = axes[1][col]
        for subset, style in (("all", "-o"), ("first", "--s"), ("later", ":^")):
            s = data[subset]
            if s:
                ws = [k for k in s["estimates"] if k.startswith("w=")]
                ax.plot([float(k[2:]) for k in ws], [s["estimates"][k]["brier"] for k in ws], style,
                        label=f"{subset} ({s['tokens']}; fitted w {s['fitted_w']:.2f})")
        ax.set(xlabel="w (weight of cal(c))", ylabel="Brier score (lower is better)")
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['config']}, batch {result['batch']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(output / "reliability.png", dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="policy-only", help="an AdaptiveSpec row of `adaptivespec bench --list`")
    parser.add_argument("--pair-models", default="qwen-coder")
    parser.add_argument("--workloads", default="general,humaneval")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--general-limit", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/estimates"))
    parser.add_argument("--replot", action="store_true", help="write results.md and reliability.png from --output's "
                                                              "results.json, run nothing")
    args = parser.parse_args()
    if args.replot:
        result = json.loads((args.output / "results.json").read_text())
        (args.output / "results.md").write_text(render(result))
        plot(result, args.output)
        return 0

    from vllm_adaptivespec.bench.configs import build_with_overrides
    from vllm_adaptivespec.bench.environment import describe
    from vllm_adaptivespec.bench.settings import LEAN_HUMANEVAL, LONG_CELLS
    from vllm_adaptivespec.bench.worker import render_prompt, run_cell, sampling_params
    from vllm_adaptivespec.bench.workloads import load
    from vllm_adaptivespec.models import model_path

    sys.path.insert(0, str(Path(__file__).parent))
    from paired import build_engine

    target, drafter = str(model_path(args.pair_models, "target")), str(model_path(args.pair_models, "drafter"))
    config = build_with_overrides(args.config, drafter)
    llm = build_engine(config, target, {"dtype": args.dtype, "max_model_len": 2048, "enforce_eager": True,
                                        "seed": 0, "max_num_seqs": args.batch})
    sink = "_adaptivespec_estimates"
    llm.collective_rpc(install_recorder, args=(sink,))
    tokenizer = llm.get_tokenizer()
    result = {"command": " ".join(sys.argv), "environment": describe(), "config": args.config,
              "batch": args.batch, "workloads": {}}
    for workload in args.workloads.split(","):
        items = load(workload, LEAN_HUMANEVAL, args.general_limit)[: args.limit]
        cell = {"temperature": 0.0, "max_tokens": LONG_CELLS["max_tokens"][workload]}
        prompts = [render_prompt(tokenizer, asdict(item)) for item in items]
        params = [sampling_params(cell, asdict(item)) for item in items]
        run_cell(llm.llm_engine, prompts, params, args.batch, lambda: None, stall_timeout_s=300.0)
        records = llm.collective_rpc(take_records, args=(sink,))[0]
        copy_records = llm.collective_rpc(take_records, args=(sink + "_copies",))[0]
        first = [r for r in records if r["k"] == 1]
        later = [r for r in records if r["k"] > 1]
        result["workloads"][workload] = {
            "all": score(records) if records else None, "first": score(first) if first else None,
            "later": score(later) if later else None,
            "reliability_cal": reliability(records, "cal"), "reliability_a": reliability(records, "a"),
            "records": records, "copies": score_copies(copy_records), "copy_records": copy_records,
        }
        print(workload, json.dumps({k: result["workloads"][workload][k] for k in ("all", "copies")}, indent=1), flush=True)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "results.json").write_text(json.dumps(result, indent=1))
    (args.output / "results.md").write_text(render(result))
    plot(result, args.output)
    llm.llm_engine.engine_core.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
