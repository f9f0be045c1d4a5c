# Sourced by the other scripts: the runtime environment vLLM on CPU needs.
# Usage: source scripts/env.sh
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ADAPTIVESPEC_ROOT="$ROOT"
export VENV="${ADAPTIVESPEC_VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH"
# Models built by `adaptivespec models prepare` (and pip's downloads) live here; ignored by git.
export ADAPTIVESPEC_CACHE="${ADAPTIVESPEC_CACHE:-$ROOT/.cache/adaptivespec}"
# Without Intel's OpenMP runtime preloaded, vLLM's CPU kernels (and speculative decoding most) are much slower.
if [ -f "$VENV/lib/libiomp5.so" ]; then
  case ":${LD_PRELOAD:-}:" in *libiomp5.so*) ;; *) export LD_PRELOAD="$VENV/lib/libiomp5.so${LD_PRELOAD:+:$LD_PRELOAD}";; esac
fi
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-4}"
# No model hub here: never let transformers / vLLM try one.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
