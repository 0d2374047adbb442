#!/usr/bin/env bash
# The GPU check, one run on a machine with an NVIDIA GPU and its own JAX with CUDA (a lent
# H200 runs it from the repo root): the Pallas kernel tests compiled for real (the
# gpu-marked test included), then benchmarks/attention_kernel.py. Logs go to $OUT (or
# /tmp/gpu_check). Packages that machine lacks travel as wheels in .whl/ (gguf).
#   bash scripts/gpu_check.sh [max seconds for the benchmark, default 300]
set -o pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
nvidia-smi -L
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
JAX_PLATFORMS=cuda timeout 240 python3 -m pytest tests/pallas_kernels -q -p no:cacheprovider \
  2>&1 | tee "$OUT/pytest.log"
timeout "${1:-300}" python3 benchmarks/attention_kernel.py --iters 10 2>&1 \
  | tee "$OUT/attention_kernel.md"
