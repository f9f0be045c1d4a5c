"""Paired A/B timing: two engines alive side by side, the same prompts alternated between them.

Why: on a shared 2-core machine throughput drifts by 10-40% within minutes, and `adaptivespec bench`
measures one configuration after another (a cell is 2-3 minutes), so the ratio of two rows carries that
drift. Here both engines are built once and kept alive (vLLM's default: each engine core in its own
process, as `vllm serve` runs it), and the work is cut into small units run A B, then B A (ABBA), so
drift cancels within a pair of units and every unit gives its own ratio:
- batch 1: a unit is one prompt (~100-160 output tokens, a few seconds);
- batch N: a unit is N prompts in flight together (closed loop), or with ``--unit-prompts M`` (M > N) M prompts
  with N in flight, each finished request replaced at once from the rest;
- before a cell's units, its first unit runs once on each engine unmeasured (warm-up at the cell's shapes).
An idle engine's core process blocks on its input queue and costs nothing; a short pause between units
lets the other's OpenMP threads stop spinning.

Per unit and engine: output tokens, wall-clock (prefill included), decode steps and their mean wall-clock
(driver-side `LLMEngine.step()` calls that returned tokens and prefilled nothing). Per cell, for A / B:
- tok/s ratio and decode-step ratio, the geometric mean over units with a bootstrap 95% interval;
- with ``--unit-prompts`` above the batch, the sustained tok/s ratio as well: tokens over wall-clock of the steps
  taken while prompts were still waiting (N in flight throughout: a server under continuous load), which leaves
  out the drain at a unit's end, where a closed batch shrinks to its slowest requests;
- identical: units whose outputs were token-identical (same drafts and verification imply the same steps).

    python benchmarks/paired.py --pairs pinned-k2:static-k2,pinned-k4:static-k4 \\
        --workloads general,humaneval --batches 1,8 --output benchmarks/results/paired-lean

Writes results.json, results.md and ratios.png under --output.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

PAUSE_S = 0.5  # between units: the engine that just ran lets its OpenMP threads go idle


def build_engine(config, target: str, engine_args: dict):
    from vllm import LLM

    extra = {}
    if config.speculative_config:
        extra["speculative_config"] = config.speculative_config
    if config.adaptivespec:
        extra["additional_config"] = {"adaptivespec": config.adaptivespec}
    return LLM(model=target, **extra, **engine_args)


def run_unit(llm, prompts: list[dict], params: list, batch: int) -> dict:
    from vllm_adaptivespec.bench.worker import run_cell

    engine = llm.llm_engine
    engine.reset_prefix_cache()
    result = run_cell(engine, prompts, params, batch, lambda: None, stall_timeout_s=300.0)
    steps = result["step_latency_ms"]
    return {
        "tokens": result["output_tokens"],
        "wall_s": result["wall_s"],
        "decode_steps": steps["decode_steps"],
        "decode_step_ms": steps["mean"],
        "sustained": result["sustained"],
        "token_ids": [o["token_ids"] for o in result["outputs"]],
    }


def geomean_ci(ratios: list[float], rounds: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Geometric mean of ``ratios`` and a percentile-bootstrap 95% interval over units."""
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / len(logs)
    rng = random.Random(seed)
    boot = sorted(sum(rng.choices(logs, k=len(logs))) / len(logs) for _ in range(rounds))
    return math.exp(mean), math.exp(boot[int(0.025 * rounds)]), math.exp(boot[int(0.975 * rounds) - 1])


def _rate(side: dict) -> float | None:
    """Sustained tok/s of one engine's unit (None without steps at full concurrency)."""
    sustained = side.get("sustained") or {}
    return sustained["tokens"] / sustained["seconds"] if sustained.get("seconds") else None


def summarize(units: list[dict]) -> dict:
    tok = [u["a"]["tokens"] / u["a"]["wall_s"] / (u["b"]["tokens"] / u["b"]["wall_s"]) for u in units]
    step = [u["a"]["decode_step_ms"] / u["b"]["decode_step_ms"] for u in units
            if u["a"]["decode_step_ms"] and u["b"]["decode_step_ms"]]
    sustained = [_rate(u["a"]) / _rate(u["b"]) for u in units if _rate(u["a"]) and _rate(u["b"])]
    out = {"units": len(units), "identical": sum(u["identical"] for u in units)}
    for name, ratios in (("tokens_per_s_ratio", tok), ("decode_step_ratio", step), ("sustained_ratio", sustained)):
        if ratios:
            g, lo, hi = geomean_ci(ratios)
            out[name] = {"geomean": g, "ci95": [lo, hi], "min": min(ratios), "max": max(ratios), "units": len(ratios)}
    for side in ("a", "b"):
        tokens = sum(u[side]["tokens"] for u in units)
        out[side] = {
            "tokens": tokens,
            "tokens_per_s": tokens / sum(u[side]["wall_s"] for u in units),
            "decode_steps": sum(u[side]["decode_steps"] for u in units),
        }
    return out


def run_pair(pair: tuple[str, str], args, items: dict, target: str, drafter: str, record: dict, save) -> None:
    from vllm_adaptivespec.bench.worker import render_prompt, sampling_params

    engine_args = {"dtype": args.dtype, "max_model_len": args.max_model_len, "enforce_eager": True, "seed": 0,
                   "max_num_seqs": max(args.batches)}
    from vllm_adaptivespec.bench.configs import build_with_overrides

    configs = [build_with_overrides(name, drafter) for name in pair]
    llms = [build_engine(config, target, engine_args) for config in configs]
    tokenizer = llms[0].get_tokenizer()
    key = f"{pair[0]} / {pair[1]}"
    try:
        for llm in llms:  # one-time costs out of the measurement
            run_unit(llm, [render_prompt(tokenizer, asdict(items[args.workloads[0]][0]))],
                     [sampling_params({"temperature": 0.0, "max_tokens": 8}, {"id": "warm"})], 1)
        for workload in args.workloads:
            cell = {"temperature": 0.0, "max_tokens": args.max_tokens[workload]}
            prompts = [render_prompt(tokenizer, asdict(item)) for item in items[workload]]
            params = [sampling_params(cell, asdict(item)) for item in items[workload]]
            for batch in args.batches:
                size = max(batch, args.unit_prompts or batch) if batch > 1 else 1  # batch 1: one prompt a unit
                chunks = [list(range(i, min(i + size, len(prompts)))) for i in range(0, len(prompts), size)]
                chunks = chunks * args.passes
                # One unit on each engine first, not measured: the cell's shapes (a batch of B at depth k) are
                # new to both, and in one process the engines share glibc's heap, so the engine that met them
                # first would pay alone for the heap's growth (with freed memory kept) and new GEMM primitives.
                for llm in llms:
                    run_unit(llm, [prompts[i] for i in chunks[0]], [params[i] for i in chunks[0]], batch)
                units = []
                for n, chunk in enumerate(chunks):
                    order = (0, 1) if n % 2 == 0 else (1, 0)  # ABBA
                    measured = {}
                    for side in order:
                        time.sleep(PAUSE_S)
                        measured[side] = run_unit(llms[side], [prompts[i] for i in chunk],
                                                  [params[i] for i in chunk], batch)
                    identical = measured[0].pop("token_ids") == measured[1].pop("token_ids")
                    units.append({"prompts": chunk, "first": pair[order[0]], "a": measured[0], "b": measured[1],
                                  "identical": identical})
                    print(f"{key} {workload} b{batch} unit {n + 1}/{len(chunks)}: tok/s "
                          f"{measured[0]['tokens'] / measured[0]['wall_s']:.2f} vs "
                          f"{measured[1]['tokens'] / measured[1]['wall_s']:.2f}", flush=True)
                record["cells"].append({"pair": list(pair), "workload": workload, "batch": batch,
                                        "summary": summarize(units), "units": units})
                save()
    finally:
        for llm in llms:
            llm.llm_engine.engine_core.shutdown()
        del llms
        gc.collect()


def render(record: dict, output: Path) -> None:
    hw = record["environment"]["hardware"]
    lines = [
        "# Paired A/B timing",
        "",
        f"- command: `{record['command']}`",
        f"- started {record['started']}, updated {record['updated']}",
        f"- engine: {record['engine_mode']}; {hw['cpu']}, {hw['cpu_cores_usable']} usable cores; "
        f"vLLM {record['environment']['vllm']}",
        f"- models: target `{record['target']}`, drafter `{record['drafter']}`",
        "- each unit (one prompt at batch 1, a batch of prompts in flight otherwise) ran on both engines back to back,"
        " order alternating (ABBA); ratios are A / B per unit, geometric mean over units with a bootstrap 95%"
        " interval. decode step = mean wall-clock of the driver's `LLMEngine.step()` calls that returned tokens"
        " and prefilled nothing.",
        "",
        "| A / B | workload | batch | units | identical | tok/s A | tok/s B | tok/s ratio (95% CI) | decode step ratio "
        "(95% CI) | unit ratios (tok/s) | decode steps A / B | sustained tok/s ratio (95% CI, units) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in record["cells"]:
        s = cell["summary"]
        t, d = s["tokens_per_s_ratio"], s["decode_step_ratio"]
        lines.append(
            f"| `{cell['pair'][0]}` / `{cell['pair'][1]}` | {cell['workload']} | {cell['batch']} | {s['units']} | "
            f"{s['identical']}/{s['units']} | {s['a']['tokens_per_s']:.2f} | {s['b']['tokens_per_s']:.2f} | "
            f"{t['geomean']:.3f} ({t['ci95'][0]:.3f}-{t['ci95'][1]:.3f}) | "
            f"{d['geomean']:.3f} ({d['ci95'][0]:.3f}-{d['ci95'][1]:.3f}) | {t['min']:.2f}-{t['max']:.2f} | "
            f"{s['a']['decode_steps']} / {s['b']['decode_steps']} | {_ratio_text(s.get('sustained_ratio'))} |")
    (output / "results.md").write_text("\n".join(lines) + "\n")


def _ratio_text(ratio: dict | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio['geomean']:.3f} ({ratio['ci95'][0]:.3f}-{ratio['ci95'][1]:.3f}, {ratio['units']})"


def plot(record: dict, output: Path) -> None:
    """Per cell, A / B throughput of every unit (closed batch; sustained beside it where measured), with the
    geometric mean and its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = record["cells"]
    if not cells:
        return
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cells)), 4))
    series = (("tokens_per_s_ratio", "tok/s, whole unit", "tab:blue", -0.15),
              ("sustained_ratio", "tok/s, sustained (batch full, prompts waiting)", "tab:orange", 0.15))
    for x, cell in enumerate(cells):
        for key, label, color, shift in series:
            if key == "tokens_per_s_ratio":
                ratios = [u["a"]["tokens"] / u["a"]["wall_s"] / (u["b"]["tokens"] / u["b"]["wall_s"])
                          for u in cell["units"]]
            else:
                ratios = [_rate(u["a"]) / _rate(u["b"]) for u in cell["units"] if _rate(u["a"]) and _rate(u["b"])]
            summary = cell["summary"].get(key)
            if not ratios or summary is None:
                continue
            jitter = [x + shift + 0.1 * ((i * 0.618) % 1 - 0.5) for i in range(len(ratios))]
            ax.scatter(jitter, ratios, s=10, alpha=0.5, color=color)
            g = summary["geomean"]
            ax.errorbar([x + shift], [g], yerr=[[g - summary["ci95"][0]], [summary["ci95"][1] - g]], fmt="o",
                        color=color, capsize=4, label=label if x == 0 else None)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([f"{c['pair'][0]}\n/{c['pair'][1]}\n{c['workload']} b{c['batch']}" for c in cells], fontsize=7)
    ax.set_ylabel("tok/s A / B (per unit; geomean, 95% CI)")
    ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    fig.savefig(output / "ratios.png", dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default="pinned-k2:static-k2,pinned-k4:static-k4",
                        help="A:B configuration names (`adaptivespec bench --list`), comma-separated")
    parser.add_argument("--pair-models", default="qwen-coder", help="model pair prepared by `adaptivespec models`")
    parser.add_argument("--workloads", default="general,humaneval")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--passes", type=int, default=1, help="times the prompt list is gone through per cell")
    parser.add_argument("--unit-prompts", type=int, default=None,
                        help="prompts per unit at batch N > 1 (default N: one closed batch); more than N measures "
                             "sustained throughput as well")
    parser.add_argument("--general-limit", type=int, default=16)
    parser.add_argument("--limit", type=int, default=None, help="at most this many prompts per workload (smoke runs)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-cache-gib", default="1",
                        help="VLLM_CPU_KVCACHE_SPACE for each engine (two engines are alive at once; 1 GiB holds "
                             "batch 8 x 2,048 tokens of the qwen-coder pair several times over)")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/paired-lean"))
    args = parser.parse_args()
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = args.kv_cache_gib  # read by each engine core at start-up
    args.workloads = args.workloads.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]

    from vllm_adaptivespec.bench.environment import describe
    from vllm_adaptivespec.bench.settings import LEAN_HUMANEVAL, LONG_CELLS
    from vllm_adaptivespec.bench.workloads import load
    from vllm_adaptivespec.models import model_path

    args.max_tokens = LONG_CELLS["max_tokens"]
    target, drafter = str(model_path(args.pair_models, "target")), str(model_path(args.pair_models, "drafter"))
    items = {w: load(w, LEAN_HUMANEVAL, args.general_limit)[: args.limit] for w in args.workloads}
    args.output.mkdir(parents=True, exist_ok=True)
    mode = ("in-process" if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
            else "engine core in its own process (vLLM's default)")
    record = {"command": " ".join(sys.argv), "started": _now(), "updated": None, "engine_mode": mode,
              "environment": describe(), "target": target, "drafter": drafter, "passes": args.passes, "cells": []}

    def save() -> None:
        record["updated"] = _now()
        (args.output / "results.json").write_text(json.dumps(record, indent=1))
        render(record, args.output)
        plot(record, args.output)

    pairs = [tuple(text.split(":")) for text in args.pairs.split(",")]
    for n, (a, b) in enumerate(pairs):
        if n and "llvmlite.binding" in sys.modules:
            # vLLM 0.32's CPU worker, at start-up, scans every loaded module for Triton kernels to override and
            # reads vars() of each attribute; llvmlite's `ffi.lib` (loaded with numba by stock `ngram`) answers
            # any attribute, `__dict__` included, with a function wrapper, and the scan fails with
            # "AttributeError: '_lib_fn_wrapper' object has no attribute 'get'". One engine per process (as
            # `vllm serve` runs) is not affected.
            rest = ",".join(f"{x}:{y}" for x, y in pairs[n:])
            print(f"paired.py: stopping before {a}:{b}: an earlier pair loaded llvmlite (stock ngram), and vLLM 0.32 "
                  f"cannot build another CPU engine in this process; run --pairs {rest} in a new invocation",
                  file=sys.stderr)
            save()
            return 1
        run_pair((a, b), args, items, target, drafter, record, save)
    save()
    return 0


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z")


if __name__ == "__main__":
    sys.exit(main())
