"""`accel serve`: load the engine, build the app, run uvicorn (127.0.0.1 unless told otherwise).

Graceful shutdown: on SIGINT/SIGTERM the engine stops admitting at once; while in-flight requests run on (for
up to `drain_timeout_s`) the listener stays open and new requests get 503 with Retry-After, and /health 503.
Requests still running at the deadline are aborted and told (an error event on a stream, a 503 body otherwise);
then the listener closes and uvicorn waits a little longer for connections.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from pathlib import Path

import uvicorn

from accel.server.app import build_app
from accel.server.async_engine import AdmissionPolicy, AsyncEngine

log = logging.getLogger("accel.server")


class _DrainingServer(uvicorn.Server):
    """uvicorn.Server that tells the engine to stop admitting the moment a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, async_engine: AsyncEngine, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.async_engine = async_engine
        self.drain_timeout_s = drain_timeout_s

    def handle_exit(self, sig, frame) -> None:
        self.async_engine.begin_shutdown(self.drain_timeout_s)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        """Keep listening while in-flight requests drain, so a new request gets 503 + Retry-After (admission is
        off) instead of a refused connection; then uvicorn's own shutdown closes the listener."""
        self.async_engine.begin_shutdown(self.drain_timeout_s)
        deadline = time.monotonic() + self.drain_timeout_s
        while self.async_engine.num_in_flight and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)


def make_server(async_engine: AsyncEngine, model_name: str, host: str = "127.0.0.1", port: int = 8000,
                api_key: str | None = None, drain_timeout_s: float = 30.0, log_level: str = "warning",
                **app_kwargs) -> uvicorn.Server:
    """A configured (not yet running) uvicorn server over the async engine."""
    app = build_app(async_engine, model_name, api_key=api_key, drain_timeout_s=drain_timeout_s, **app_kwargs)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=int(drain_timeout_s) + 5)
    return _DrainingServer(config, async_engine, drain_timeout_s)


def speculative_config(draft: str, num_speculative_tokens: int = 4, draft_min_path_confidence: float | None = None,
                       draft_min_first_confidence: float | None = None, draft_ngram_first: bool = False):
    """`--draft` -> SpeculativeConfig: "ngram" is prompt lookup, anything else a draft model (registry name or
    folder); the other arguments are SpeculativeConfig's fields of the same names (the confidence gates and
    draft_ngram_first need a draft model: refused for n-gram)."""
    from accel.speculative.config import SpeculativeConfig

    gates = dict(draft_min_path_confidence=draft_min_path_confidence,
                 draft_min_first_confidence=draft_min_first_confidence, draft_ngram_first=draft_ngram_first)
    if draft == "ngram":
        return SpeculativeConfig(method="ngram", num_speculative_tokens=num_speculative_tokens, **gates)
    return SpeculativeConfig(method="draft", draft_model=str(_resolve(draft)),
                             num_speculative_tokens=num_speculative_tokens, **gates)


GIL_SWITCH_INTERVAL_S = 0.0005


def run_server(model: str, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
               draft: str | None = None, num_speculative_tokens: int = 4,
               draft_min_path_confidence: float | None = None, draft_min_first_confidence: float | None = None,
               draft_ngram_first: bool = False,
               served_model_name: str | None = None, max_queue: int = 256,
               kv_pressure_threshold: float = 0.95, drain_timeout_s: float = 30.0, log_level: str = "info",
               skip_verify: bool = False, **engine_kwargs) -> None:
    """Serve `model` (a model name known to accel.models, or an HF folder / exported checkpoint) until stopped.

    engine_kwargs are EngineConfig fields (max_num_seqs, num_kv_blocks, max_model_len, dtype, ...).
    `draft`: speculative decoding with a draft model (name or folder sharing the target's tokenizer; refused
    otherwise) or "ngram" (prompt lookup); acceptance counters go into each response's usage and /metrics.
    An accel export (a folder with accel.json) is served only when every file matches its manifest's sha256
    (`skip_verify` serves it anyway); a damaged folder raises ModelLoadError naming the file.
    """
    from accel.export.load import load_engine

    path = _resolve(model)
    if not skip_verify:
        verify_before_serving(path)
    if draft is not None:
        engine_kwargs["speculative"] = speculative_config(draft, num_speculative_tokens, draft_min_path_confidence,
                                                          draft_min_first_confidence, draft_ngram_first)
    name = served_model_name or (model if not Path(model).exists() else Path(model).name)
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO))
    # plain HF folders and accel exports (compressed-tensors), built on the thread that will step them
    async_engine = AsyncEngine.launch(lambda: load_engine(path, **engine_kwargs),
                                      AdmissionPolicy(max_queue=max_queue, kv_pressure_threshold=kv_pressure_threshold))
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("binding %s: the server is reachable from other machines%s", host,
                    "" if api_key else " and has NO API key (pass --api-key)")
    server = make_server(async_engine, name, host=host, port=port, api_key=api_key,
                         drain_timeout_s=drain_timeout_s, log_level=log_level.lower())
    log.info("serving %s (%s) on http://%s:%d/v1", name, path, host, port)
    # The engine thread gives up the GIL inside every torch op and must win it back to launch the next one; with
    # the default 5 ms switch interval a busy event loop (64 streams) keeps it that long while the OpenMP
    # threads idle. 0.5 ms hands it back sooner at a negligible cost to the event loop.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it drained on; the shutdown was already clean
        log.info("server stopped")


def verify_before_serving(path: Path) -> None:
    """Refuse (ModelLoadError) an accel export whose files do not match its accel.json; plain folders pass.
    Hashing every file is cheap next to loading them (0.34 s for 538 MB on a 2-core CPU), so it is always done."""
    from accel.export.checkpoint import MANIFEST_NAME, check_files
    from accel.export.load import ModelLoadError

    if not (path / MANIFEST_NAME).exists():
        return
    t0 = time.perf_counter()
    problems, n = check_files(path)
    if problems:
        raise ModelLoadError(f"refusing to serve {path}: it does not match its {MANIFEST_NAME} ("
                             + "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
                             + "). Re-export it, or pass --skip-verify to serve it anyway.")
    log.info("verified %d files of %s against %s in %.2f s", n, path, MANIFEST_NAME, time.perf_counter() - t0)


def _resolve(model: str) -> Path:
    """A registry name, an HF folder or a .gguf file -> a local HF folder (accel.models does the work)."""
    from accel.models import resolve_model

    return Path(resolve_model(model))


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral TCP port that is free right now (for tests and benchmarks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
