#!/usr/bin/env bash
# Start llama.cpp's llama-server (built by install_llama_cpp.sh) on loopback, on the same
# SmolLM2 GGUF as ours, in the foreground:
#   bash benchmarks/peers/start_llama_server.sh [--port 30001] [--parallel 16] [--ctx-per-slot 1024]
#                                              [--chat-template-file F] [--model GGUF]
# -fa off: flash attention halved its decode on this CPU (measured at 800-token context);
# --parallel N slots = continuous batching of N requests; -c is the total context
# (N x ctx-per-slot); --jinja renders chat with the GGUF's own chat template, as ours does.
set -euo pipefail
cd "$(dirname "$0")/../.."
port=30001
parallel=16
ctx_per_slot=1024
threads="${THREADS:-2}"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --parallel) parallel="$2"; shift 2 ;;
    --ctx-per-slot) ctx_per_slot="$2"; shift 2 ;;
    --chat-template-file) extra+=(--chat-template-file "$2"); shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
bin="${LLAMA_SERVER:-$HOME/.cache/radixjax-peers/llama.cpp/build/bin/llama-server}"
[ -x "$bin" ] || { echo "no $bin: run benchmarks/peers/install_llama_cpp.sh" >&2; exit 1; }
model="${MODEL:-$(.venv/bin/python -c 'from radixjax.loaders import default_model_path as p; print(p())')}"
exec "$bin" -m "$model" --host 127.0.0.1 --port "$port" -t "$threads" -tb "$threads" \
  -fa off --parallel "$parallel" -c $((parallel * ctx_per_slot)) --jinja --no-webui \
  ${extra[@]+"${extra[@]}"}
