#!/usr/bin/env bash
# Set up .venv with accel and everything it needs, from the project's own files.
#
# torch: on our CPU machines `pip install torch==2.13.0` takes the CPU build from local disk in seconds; a plain
# `torch` would pull a multi-GB CUDA build. GPU users install the CUDA torch they want first (or set
# ACCEL_TORCH_SPEC, e.g. "torch==2.13.0" with PIP_INDEX_URL pointing at a CUDA index); any torch already in the venv
# that satisfies pyproject's range is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Headless Chromium + chromedriver (Debian packages) render the HTML report in tests/report; without them those
# tests skip with a reason. Installed only where we are root with apt-get (CI, our dev machines).
if { ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; } && command -v apt-get >/dev/null \
   && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
    || echo "setup: could not install chromium; the browser tests will skip"
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip 2>&1 | grep -v "is ignored" || true
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  "${PIP[@]}" install "${ACCEL_TORCH_SPEC:-torch==2.13.0}" 2>&1 | grep -v "is ignored" || true
fi
"${PIP[@]}" install -e ".[dev]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import torch, transformers, accel; print(f'accel {accel.__version__}: torch {torch.__version__}, transformers {transformers.__version__}, cuda={torch.cuda.is_available()}')"
