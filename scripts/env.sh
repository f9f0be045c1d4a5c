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
# glibc malloc: keep freed memory instead of returning it to the kernel after every step. With the defaults each
# engine step maps fresh pages for its large temporaries (logits, MLP activations) and the kernel zeroes them:
# ~6,000 page faults a step at batch 8 on the qwen-coder pair, stock vLLM as much as AdaptiveSpec; with these,
# 3-7% shorter steps (benchmarks/results/step-breakdown). No tcmalloc here, which vLLM's CPU docs would preload.
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-1073741824}"
export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-4294967296}"
export MALLOC_TOP_PAD_="${MALLOC_TOP_PAD_:-268435456}"
# No model hub here: never let transformers / vLLM try one.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
