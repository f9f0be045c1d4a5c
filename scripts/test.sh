#!/usr/bin/env bash
# Set up the environment (idempotent) and run the test suite. Extra arguments go to pytest.
#   scripts/test.sh                 # everything (CI runs this)
#   scripts/test.sh tests/unit -x   # a subset
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" cpu dev,ray
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec python -m pytest "$@"
