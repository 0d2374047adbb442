#!/usr/bin/env bash
# Build llama.cpp's OpenAI-compatible C++ server (`llama-server`), its perplexity tool
# (`llama-perplexity`) and tokenizer (`llama-tokenize`; both for benchmarks/quality.py) from the llama.cpp sources vendored in the
# llama-cpp-python sdist on PyPI (no other network access needed).
#   bash benchmarks/peers/install_llama_cpp.sh [PREFIX]     (default ~/.cache/radixjax-peers)
# Prints the path of the built llama-server on its last line (llama-perplexity beside it). ~4-5 min on 2 cores; run heavy
# builds under the shared lock: flock /tmp/heavy.lock bash benchmarks/peers/install_llama_cpp.sh
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
prefix="${1:-$HOME/.cache/radixjax-peers}"
version="${LLAMA_CPP_PYTHON_VERSION:-}"   # empty = newest sdist on the registry
python="${PYTHON:-python3}"
jobs="${JOBS:-2}"
bin="$prefix/llama.cpp/build/bin/llama-server"

if [ -x "$bin" ] && [ -x "$(dirname "$bin")/llama-perplexity" ] \
    && [ -x "$(dirname "$bin")/llama-tokenize" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$prefix/sdist"
spec="llama-cpp-python${version:+==$version}"
"$python" -m pip download -q --no-deps --no-binary :all: -d "$prefix/sdist" "$spec"
sdist="$(ls -t "$prefix"/sdist/llama_cpp_python-*.tar.gz | head -1)"
rm -rf "$prefix/src" && mkdir -p "$prefix/src"
tar -xzf "$sdist" -C "$prefix/src"
src="$(ls -d "$prefix"/src/llama_cpp_python-*/vendor/llama.cpp)"
if [ ! -f "$prefix/llama.cpp/CMakeLists.txt" ]; then   # kept when only a target is missing
  rm -rf "$prefix/llama.cpp" && cp -r "$src" "$prefix/llama.cpp"
fi

# -march=native enables AMX kernels that segfault on these VMs: switch them off.
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cd "$prefix/llama.cpp"
CFLAGS="$no_amx" CXXFLAGS="$no_amx" cmake -S . -B build \
  -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TOOLS=ON \
  -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build build --target llama-server llama-perplexity llama-tokenize -j "$jobs" >/dev/null
echo "$bin"
