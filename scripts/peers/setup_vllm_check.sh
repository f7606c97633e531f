#!/usr/bin/env bash
# Build the side venv in which `accel export verify --target vllm` runs vLLM's own code on an export, on a CPU box:
# $ACCEL_HOME/peers/vllm-check/venv (~2.2 GB, a few minutes; run once per machine).
#
# vLLM is installed --no-deps: its metadata pins torch 2.14 and ~9 GB of CUDA packages, none of which the check
# needs (it runs vLLM's config parser, scheme choice and weight loaders, never a CUDA kernel). Only what its import
# path needs comes after it. Never `pip install vllm` or a plain `torch` here: that pulls the CUDA build.
set -euo pipefail
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
HOME_DIR=${ACCEL_HOME:-$HOME/.cache/accel}
DIR="$HOME_DIR/peers/vllm-check"
PY=${PYTHON:-python3}
mkdir -p "$DIR/wheels"
[ -x "$DIR/venv/bin/python" ] || "$PY" -m venv "$DIR/venv"
PIP=("$DIR/venv/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install torch==2.13.0                  # the CPU build (from local disk on our machines)
"${PIP[@]}" download --no-deps "vllm==$VLLM_VERSION" -d "$DIR/wheels"
"${PIP[@]}" install --no-deps "$DIR"/wheels/vllm-"$VLLM_VERSION"-*.whl
"${PIP[@]}" install --no-deps compressed-tensors==0.17.0   # the version vLLM 0.33 pins
"${PIP[@]}" install transformers==5.17.0 pydantic cachetools msgspec cloudpickle psutil py-cpuinfo pyzmq blake3 numpy
# the rest of vLLM's import path (config -> entrypoints, structured output, multimodal), pinned where vLLM pins
"${PIP[@]}" install --no-deps cbor2 urllib3 aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal \
  frozenlist requests openai-harmony openai httpx2 sniffio pillow pybase64 uvloop prometheus_client xgrammar==0.2.8 \
  apache-tvm-ffi==0.1.11 fastapi==0.136.3 starlette partial_json_parser llguidance==1.7.6 einops loguru
"$DIR/venv/bin/python" -c "import vllm; print(f'vLLM {vllm.__version__} ready in $DIR/venv')" 2>/dev/null | tail -1
