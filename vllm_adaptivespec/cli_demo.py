"""`adaptivespec demo`: the main job on an embedded pair, in a few minutes.

Builds the pair if needed, then runs a small slice of the benchmark (same harness, same figures):
the target alone, stock vLLM draft-model speculation, and AdaptiveSpec lossless and with the margin
rule, and prints tokens/s and acceptance side by side.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_adaptivespec import cli_bench


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "demo", help="prepare an embedded pair and compare AdaptiveSpec with plain and stock speculation",
        description=__doc__,
    )
    parser.add_argument("--pair", default=cli_bench.DEFAULT_PAIR, help="embedded pair (default: qwen-coder)")
    parser.add_argument("--tau", type=float, default=0.7, help="margin threshold of the lossy run (default 0.7, the recommended lossy tau)")
    parser.add_argument("--output", type=Path, default=Path("adaptivespec-demo"),
                        help="where results.json/results.md go (default: ./adaptivespec-demo)")
    parser.set_defaults(func=main)
    return parser


def main(args) -> int:
    from vllm_adaptivespec.models import ModelPrepareError, prepare

    try:
        pair = prepare(args.pair)
    except ModelPrepareError as err:
        raise SystemExit(f"adaptivespec demo: {err}") from None
    print(f"[demo] target {pair.target}\n[demo] drafter {pair.drafter}")
    bench = argparse.ArgumentParser(prog="adaptivespec")
    cli_bench.add_parser(bench.add_subparsers(dest="command", required=True))
    bench_args = bench.parse_args([
        "bench", "--mode", "quick", "--pair", args.pair,
        "--configs", f"ar,static-k4,policy-only,adaptive@{args.tau}",
        "--humaneval-problems", "0,13", "--general-limit", "2",
        "--output", str(args.output), "--fresh", "--budget-minutes", "0",
    ])  # fmt: skip
    status = cli_bench.main(bench_args)
    report = args.output / "results.md"
    if report.exists():
        print(report.read_text())
    return status
