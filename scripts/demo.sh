#!/usr/bin/env bash
# Set up (idempotent), build the embedded default models, and run the main job on them.
#   scripts/demo.sh                   # qwen-coder pair, AdaptiveSpec vs plain speculation vs none
#   scripts/demo.sh --pair smollm2    # any `adaptivespec demo` option
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" cpu dev
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec adaptivespec demo "$@"
