"""accel.server: an OpenAI-compatible HTTP server over the accel runtime.

protocol.py      pydantic request / response models (OpenAI + vLLM extensions), the OpenAI error body
convert.py       request -> (prompt token ids, SamplingParams) checks and response helpers (pure)
async_engine.py  AsyncEngine: steps the engine on the event loop; per-request streams, admission, graceful shutdown
metrics.py       Prometheus metrics with vLLM's names
app.py           build_app(): the FastAPI routes and error handlers
serve.py         run_server(): load the engine, run uvicorn (`accel serve`)
"""

from accel.server.app import build_app
from accel.server.async_engine import AdmissionPolicy, AsyncEngine
from accel.server.serve import make_server, run_server

__all__ = ["build_app", "AdmissionPolicy", "AsyncEngine", "make_server", "run_server"]
