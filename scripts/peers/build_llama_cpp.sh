#!/usr/bin/env bash
# Build llama.cpp's llama-bench, llama-server, llama-perplexity, llama-quantize, llama-tokenize and llama-imatrix from the source
# vendored in the llama-cpp-python sdist (PyPI is the one source reachable here), into
# $ACCEL_HOME/peers/llama.cpp/bin, once per machine (~20 minutes on 2 cores; a second run finds the binaries and returns). Tuned for this CPU
# (GGML_NATIVE), as a user building llama.cpp would.
#   bash scripts/peers/build_llama_cpp.sh            # build if missing, print the bin folder
#   LLAMA_CPP_PYTHON_VERSION=0.3.36 bash ...         # pin another sdist
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
HOME_DIR=${ACCEL_HOME:-$HOME/.cache/accel}
ROOT="$HOME_DIR/peers/llama.cpp"
BIN="$ROOT/bin"
TOOLS=(llama-bench llama-server llama-perplexity llama-quantize llama-tokenize llama-imatrix)
built() { for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || return 1; done; }
if [ -z "${FORCE:-}" ] && built; then
  echo "$BIN"; exit 0
fi
mkdir -p "$ROOT/src"
PY=${PYTHON:-python3}
"$PY" -m pip download --disable-pip-version-check -q --no-binary :all: --no-deps "llama-cpp-python==$VERSION" \
  -d "$ROOT/src" >&2
SRC="$ROOT/src/llama_cpp_python-$VERSION"
[ -d "$SRC" ] || tar xzf "$ROOT/src/llama_cpp_python-$VERSION.tar.gz" -C "$ROOT/src"
cmake -S "$SRC/vendor/llama.cpp" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$ROOT/build" -j "$(nproc)" --target "${TOOLS[@]}" >&2
mkdir -p "$BIN"
for t in "${TOOLS[@]}"; do cp "$ROOT/build/bin/$t" "$BIN/"; done
echo "$BIN"
