"""`RuntimeConfig`: every setting of the embedded runtime, declared once.

The recipe's `runtime:` section is this class; `EngineConfig` extends it with what a loaded model brings (the
path, dtype, quantization plan, speculation); `accel serve` generates one option per field from it; the
scheduler's defaults are read from it. So `accel optimize` measures the engine `accel serve` starts.

A plain dataclass checked in `__post_init__`, so the runtime imports neither torch nor pydantic here (the GPU
machine has no pydantic); the recipe validates it through pydantic all the same (`__pydantic_config__`: unknown
fields fail, the attribute docstrings are the JSON schema's descriptions and the CLI's help).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

KV_CACHE_DTYPES = ("auto", "int8")
WEIGHT_DTYPES = ("auto", "float16")
PREEMPTION_MODES = ("recompute", "swap")
STRICT = {"extra": "forbid", "use_attribute_docstrings": True}
"""pydantic's config for the dataclasses the recipe nests (a plain dict: pydantic is not imported here)."""


def check_range(owner: object, name: str, lo: float | None = None, hi: float | None = None,
                optional: bool = False, integer: bool = True) -> None:
    """Raise ValueError naming `name`, its value and what is allowed unless lo <= value <= hi."""
    value = getattr(owner, name)
    if optional and value is None:
        return
    kind = int if integer else (int, float)
    ok = isinstance(value, kind) and not isinstance(value, bool) and (lo is None or value >= lo) \
        and (hi is None or value <= hi)
    if not ok:
        rule = " and ".join(r for r in (f">= {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else "")
                            if r)
        what = "an integer" if integer else "a number"
        raise ValueError(f"{name}={value!r} is invalid; allowed: {'None or ' if optional else ''}{what} {rule}")


def check_choice(owner: object, name: str, choices: tuple) -> None:
    value = getattr(owner, name)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is invalid; allowed: {', '.join(map(repr, choices))}")


@dataclass(kw_only=True)
class RuntimeConfig:
    __pydantic_config__ = STRICT

    device: str = "auto"
    """auto (CUDA when torch sees a device, else CPU), cpu, cuda or cuda:N."""
    block_size: int = 16
    """Tokens per KV cache block."""
    num_kv_blocks: int | None = None
    """KV cache blocks of every layer (a hybrid model's pool holds as many bytes of its groups' blocks); None: as many
    as kv_cache_memory_gb holds."""
    kv_cache_memory_gb: float = 1.0
    """KV cache budget in GiB when num_kv_blocks is not set."""
    kv_cache_dtype: Literal["auto", "int8"] = "auto"
    """auto: the model's dtype; int8: K/V stored as INT8 with a scale per token and head."""
    weight_dtype: Literal["auto", "float16"] = "auto"
    """How a CPU holds the Linears that run unquantized: auto: in the compute dtype (fp32); float16: in fp16, each
    weight converted to fp32 in the kernel (half the bytes a decode step streams; needs AVX-512)."""
    max_num_seqs: int = 64
    """Requests running in one step."""
    max_num_batched_tokens: int = 512
    """Tokens (prefill chunks plus decode rows) one step may carry."""
    max_waiting: int = 256
    """Requests accepted but not yet running; one more is refused (HTTP 429 in the server): beyond it, queueing only
    adds latency a client would rather spend retrying elsewhere."""
    max_wait_steps: int = 256
    """Starvation bound: a request that waited this many steps can no longer be passed by a higher priority."""
    long_prefill_token_threshold: int | None = None
    """Cap on one request's prefill chunk per step, so a long prompt leaves budget to admit others (None: no
    cap)."""
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    """recompute: a preempted request drops its K/V and recomputes them; swap: they are copied to host memory and
    back on resume."""
    max_model_len: int | None = None
    """Prompt plus output tokens of one request; None: the model's max_position_embeddings."""
    enable_prefix_caching: bool = True
    """Reuse the K/V of full blocks whose token prefix was computed before."""
    num_threads: int | None = None
    """CPU threads; None: torch's default (one per core)."""
    num_scheduler_steps: int = 8
    """Greedy decode steps (or n-gram verify steps at batch 1) one native call runs in a row when nothing waits
    (vLLM's multi-step scheduling); tokens then stream in bursts. 1: one step at a time."""

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or (self.device not in ("auto", "cpu", "cuda") and not (
                self.device.startswith("cuda:") and self.device[5:].isdigit())):
            raise ValueError(f"device={self.device!r} is invalid; allowed: 'auto', 'cpu', 'cuda', 'cuda:N'")
        check_range(self, "block_size", 1, 256)
        check_range(self, "num_kv_blocks", 1, optional=True)
        check_range(self, "kv_cache_memory_gb", 0, 4096, integer=False)
        check_choice(self, "kv_cache_dtype", KV_CACHE_DTYPES)
        check_choice(self, "weight_dtype", WEIGHT_DTYPES)
        check_range(self, "max_num_seqs", 1, 4096)
        check_range(self, "max_num_batched_tokens", 1, 1 << 20)
        check_range(self, "max_waiting", 1)
        check_range(self, "max_wait_steps", 1)
        check_range(self, "long_prefill_token_threshold", 1, optional=True)
        check_choice(self, "preemption_mode", PREEMPTION_MODES)
        check_range(self, "max_model_len", 1, optional=True)
        check_choice(self, "enable_prefix_caching", (True, False))
        check_range(self, "num_threads", 1, 1024, optional=True)
        check_range(self, "num_scheduler_steps", 1, 64)

    @property
    def kv_cache_memory_bytes(self) -> int:
        return int(self.kv_cache_memory_gb * (1 << 30))

    def runtime_fields(self) -> dict:
        """This config's RuntimeConfig fields (of an EngineConfig too), as keyword arguments."""
        return {f.name: getattr(self, f.name) for f in fields(RuntimeConfig)}


RUNTIME_DEFAULTS = {f.name: f.default for f in fields(RuntimeConfig)}
"""Each runtime setting's default, for code that configures one part (the scheduler) without the whole."""
