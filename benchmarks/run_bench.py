"""`python benchmarks/run_bench.py [options]` = `adaptivespec bench [options]` (see --help)."""

import sys

from vllm_adaptivespec.cli_bench import standalone

if __name__ == "__main__":
    sys.exit(standalone())
