"""`accel serve`: load the engine, build the app, run uvicorn (127.0.0.1 unless told otherwise).

Graceful shutdown: on SIGINT/SIGTERM the engine stops admitting at once; while in-flight requests run on (for
up to `drain_timeout_s`) the listener stays open and new requests get 503 with Retry-After, and /health 503.
Requests still running at the deadline are aborted and told (an error event on a stream, a 503 body otherwise);
then the listener closes and uvicorn waits a little longer for connections.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time
from pathlib import Path

import uvicorn

from accel.server.app import build_app
from accel.server.protocol import DRAIN_TIMEOUT_S
from accel.server.async_engine import AdmissionPolicy, AsyncEngine
from accel.server.config import ServerConfig

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
                api_key: str | None = None, drain_timeout_s: float = DRAIN_TIMEOUT_S, log_level: str = "warning",
                **app_kwargs) -> uvicorn.Server:
    """A configured (not yet running) uvicorn server over the async engine."""
    app = build_app(async_engine, model_name, api_key=api_key, drain_timeout_s=drain_timeout_s, bind_host=host,
                    **app_kwargs)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=int(drain_timeout_s) + 5)
    return _DrainingServer(config, async_engine, drain_timeout_s)


def speculative_config(spec: str | dict):
    """`--speculative-config`, a JSON object of SpeculativeConfig's fields (as vLLM's flag), -> SpeculativeConfig,
    or None for '{"method": "none"}' (serve without speculation, an export's own drafter included); `draft_model`
    may be a registry name or a folder, and implies method "draft". Raises ValueError naming the bad field or value
    (ModelNotFoundError for a draft that is not there)."""
    import dataclasses

    from accel.speculative.config import SpeculativeConfig

    example = '{"method": "ngram", "num_speculative_tokens": 4}'
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"speculative config {spec!r} is not JSON ({e.msg}); expected an object such as "
                             f"'{example}'") from None
    if not isinstance(spec, dict):
        raise ValueError(f"speculative config {spec!r} is invalid; expected a JSON object such as '{example}'")
    allowed = [f.name for f in dataclasses.fields(SpeculativeConfig)]
    unknown = sorted(set(spec) - set(allowed))
    if unknown:
        raise ValueError(f"speculative config fields {unknown} are unknown; allowed: {', '.join(allowed)}")
    if spec.get("method") == "none":
        if len(spec) > 1:
            raise ValueError(f"speculative config {json.dumps(spec)}: method 'none' takes no other fields; got "
                             f"{sorted(set(spec) - {'method'})}")
        return None
    if spec.get("draft_model"):
        spec = {"method": "draft", **spec, "draft_model": str(_resolve(str(spec["draft_model"])))}
    try:
        return SpeculativeConfig(**spec)
    except TypeError as e:  # a value of the wrong type met a comparison
        raise ValueError(f"speculative config {json.dumps(spec)} has a value of the wrong type ({e})") from None


GIL_SWITCH_INTERVAL_S = 0.0005


def serving_speculation(path: Path, speculative=None):
    """What the served engine speculates with: `speculative` (a SpeculativeConfig, or `--speculative-config`'s JSON
    / dict; '{"method": "none"}' serves without), else the export's own drafter (`export_speculative_config`: a
    user who optimized a pairing gets it), else nothing."""
    from accel.export.load import export_speculative_config

    if speculative is not None:
        return speculative_config(speculative) if isinstance(speculative, (str, dict)) else speculative
    spec = export_speculative_config(path)
    if spec is not None:
        log.info("speculating with the export's own drafter (%s, %d tokens); --speculative-config "
                 "'{\"method\": \"none\"}' serves without", spec.method if spec.method == "ngram" else
                 f"draft {spec.draft_model}", spec.num_speculative_tokens)
    return spec


def run_server(model: str, server: ServerConfig | None = None, speculative=None, **engine_kwargs) -> None:
    """Serve `model` (a model name known to accel.hub, or an HF folder / exported checkpoint) until stopped.

    `server`: the HTTP server's settings; engine_kwargs are EngineConfig fields (max_num_seqs, max_waiting,
    num_kv_blocks, max_model_len, dtype, ...). `speculative`: a SpeculativeConfig, or its JSON / dict
    (`speculative_config`); None: the export's own drafter, if any (`serving_speculation`); acceptance counters go
    into each response's usage and /metrics.
    An accel export (a folder with accel.json) is served only when every file matches its manifest's sha256
    (`server.skip_verify` serves it anyway); a damaged folder raises ModelLoadError naming the file.
    """
    from accel.export.load import load_engine

    cfg = server or ServerConfig()
    host, port = cfg.host, cfg.port
    logging.basicConfig(level=getattr(logging, cfg.log_level.upper(), logging.INFO))
    path = _resolve(model)
    if not cfg.skip_verify:
        verify_before_serving(path)
    spec = serving_speculation(path, speculative)
    if spec is not None:
        engine_kwargs["speculative"] = spec
    name = cfg.served_model_name or (model if not Path(model).exists() else Path(model).name)
    # plain HF folders and accel exports (compressed-tensors), built on this thread: it runs the event loop that
    # steps the engine, and torch's OpenMP pool belongs to the thread that first runs parallel work
    async_engine = AsyncEngine(load_engine(path, **engine_kwargs),
                               AdmissionPolicy(kv_pressure_threshold=cfg.kv_pressure_threshold))
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("binding %s: the server is reachable from other machines%s", host,
                    "" if cfg.api_key else " and has NO API key (pass --api-key)")
    server = make_server(async_engine, name, host=host, port=port, api_key=cfg.api_key,
                         drain_timeout_s=cfg.drain_timeout_s, log_level=cfg.log_level,
                         allow_priority=cfg.allow_priority, protect_metrics=cfg.protect_metrics)
    from accel.memory import GB, current_rss, peak_line

    held = async_engine.engine.memory()
    log.info("loaded %s: weights %.2f GB, KV cache %.2f GB; RSS %.2f GB, %s", name, held["weights"] / GB,
             held["KV cache"] / GB, current_rss() / GB, peak_line())
    log.info("serving %s (%s) on http://%s:%d/v1", name, path, host, port)
    # The engine gives up the GIL inside torch ops and must win it back to launch the next one; with the default
    # 5 ms switch interval the tokenizer thread could keep it that long while the OpenMP threads idle.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it drained on; the shutdown was already clean
        log.info("server stopped")
    log.info("%s", peak_line("while serving", held))


def verify_before_serving(path: Path) -> None:
    """Refuse (ModelLoadError) an accel export whose files do not match its accel.json; plain folders pass.
    Hashing every file is cheap next to loading them (0.34 s for 538 MB on a 2-core CPU), so it is always done."""
    from accel.export.checkpoint import MANIFEST_NAME, check_files
    from accel.export.load import ModelLoadError

    if not (path / MANIFEST_NAME).exists():
        if (path / "accel_plan.json").exists():  # an accel export without its manifest: nothing to check it by
            log.warning("%s is an accel export without its %s: serving it unverified", path, MANIFEST_NAME)
        return
    links = sorted(str(f.relative_to(path)) for f in path.rglob("*") if f.is_symlink())
    if links:  # a manifest vouches for the files in the folder, not for what a link points at
        raise ModelLoadError(f"refusing to serve {path}: an export holds files, not symlinks ({', '.join(links[:3])})"
                             ". Copy the files in, or pass --skip-verify to serve it anyway.")
    t0 = time.perf_counter()
    problems, n = check_files(path)
    if problems:
        raise ModelLoadError(f"refusing to serve {path}: it does not match its {MANIFEST_NAME} ("
                             + "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
                             + "). Re-export it, or pass --skip-verify to serve it anyway.")
    log.info("verified %d files of %s against %s in %.2f s", n, path, MANIFEST_NAME, time.perf_counter() - t0)


def _resolve(model: str) -> Path:
    """A registry name, an HF folder or a .gguf file -> a local HF folder (accel.hub does the work)."""
    from accel.hub import resolve_model

    return Path(resolve_model(model))


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral TCP port that is free right now (for tests and benchmarks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
