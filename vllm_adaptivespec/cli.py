"""`adaptivespec` command line: one subcommand module per job, each exposing `add_parser`."""

from __future__ import annotations

import argparse
import sys

from vllm_adaptivespec import __version__, cli_bench, cli_demo, cli_models


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adaptivespec",
        description="AdaptiveSpec speculative decoding for vLLM: models, demo, benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-adaptivespec {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (cli_models, cli_demo, cli_bench):
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
