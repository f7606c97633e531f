"""`ServerConfig`: every setting of `accel serve`'s HTTP server, declared once. The runtime's own settings are
`RuntimeConfig`'s (requests waiting before a 429 included: `max_waiting`); `accel serve` generates one option per
field of both (`cli/options.py`), and `run_server` reads this one.

A plain dataclass checked in `__post_init__`, like RuntimeConfig (pydantic validates it for the CLI all the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from accel.runtime.config import STRICT, check_choice, check_range
from accel.server.protocol import DRAIN_TIMEOUT_S

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
API_KEY_ENV = "ACCEL_API_KEY"
"""Where `accel serve` reads an API key that --api-key does not give (kept out of the process list)."""


@dataclass(kw_only=True)
class ServerConfig:
    __pydantic_config__ = STRICT

    host: str = "127.0.0.1"
    """Address to bind; 0.0.0.0 exposes it beyond this machine."""
    port: int = 8000
    """TCP port."""
    api_key: str | None = None
    """Require this Bearer key (default: $ACCEL_API_KEY)."""
    served_model_name: str | None = None
    """Model name clients send (default: the model's own)."""
    kv_pressure_threshold: float = 0.95
    """Refuse (429) while KV cache usage is at least this and requests are already waiting."""
    drain_timeout_s: float = DRAIN_TIMEOUT_S
    """Seconds in-flight requests get to finish on shutdown; then they are aborted."""
    allow_priority: bool = False
    """Honour requests' `priority` without an API key."""
    protect_metrics: bool = False
    """/metrics needs the API key too."""
    skip_verify: bool = False
    """Serve an export even when its files do not match its accel.json (checked by default)."""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """uvicorn's and accel's log level."""

    def __post_init__(self) -> None:
        check_range(self, "port", 1, 65535)
        if not 0.0 < self.kv_pressure_threshold <= 1.0:
            raise ValueError(f"kv_pressure_threshold={self.kv_pressure_threshold!r} is invalid; allowed: (0, 1]")
        check_range(self, "drain_timeout_s", 0, None, integer=False)
        check_choice(self, "log_level", LOG_LEVELS)
        if self.protect_metrics and self.api_key is None:
            raise ValueError("protect_metrics=True needs an api_key: without one /metrics has nothing to check")
