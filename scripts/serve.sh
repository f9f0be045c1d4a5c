#!/usr/bin/env bash
# Set up (idempotent), build the pair, start vLLM's OpenAI server with AdaptiveSpec on it, wait until it
# is healthy, show one real completion with its speed and acceptance, then keep serving (Ctrl-C stops).
#   scripts/serve.sh                       # qwen-coder, tau 0.7, http://127.0.0.1:8000
#   PAIR=smollm2 TAU=1 PORT=8001 scripts/serve.sh [extra vllm serve flags]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" cpu dev
source "$ROOT/scripts/env.sh"
PAIR="${PAIR:-qwen-coder}" PORT="${PORT:-8000}"
adaptivespec models prepare --pair "$PAIR"
EAGER=(); command -v nvidia-smi >/dev/null || EAGER=(--enforce-eager)  # CPU: skip minutes of torch.compile
MODEL_PAIR="$PAIR" ADAPTIVESPEC_TAU="${TAU:-0.7}" HOST=127.0.0.1 PORT="$PORT" SERVED_MODEL_NAME="$PAIR" \
  MAX_MODEL_LEN="${MAX_MODEL_LEN:-4096}" "$ROOT/deploy/entrypoint.sh" "${EAGER[@]}" "$@" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' INT TERM EXIT
python "$ROOT/scripts/first_completion.py" --url "http://127.0.0.1:$PORT" --model "$PAIR" --server-pid "$SERVER"
echo "serving $PAIR with AdaptiveSpec at http://127.0.0.1:$PORT/v1 (metrics: /metrics); Ctrl-C stops"
wait "$SERVER"
