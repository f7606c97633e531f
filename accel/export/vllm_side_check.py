"""vLLM's own code on an accel export, on a CPU box: config parse, scheme per fused module, weight loading, values.

Runs only in the side venv that `scripts/peers/setup_vllm_check.sh` builds (vLLM installed --no-deps next to a CPU
torch); accel never imports this file. `accel export verify DIR --target vllm` runs

    $ACCEL_HOME/peers/vllm-check/venv/bin/python vllm_side_check.py EXPORT_DIR

and reads one JSON report from stdout (exit 0: vLLM accepts the export). Every check is vLLM's code; no CUDA kernel
runs:
  1. config: EngineArgs(model=EXPORT).create_model_config(), VllmConfig._get_quantization_config (what
     VllmConfig.__post_init__ calls) and create_engine_config(), with `--speculative-config` when given.
  2. schemes: per decoder layer and fused module (qkv_proj, gate_up_proj), the scheme of each HF shard as vLLM's
     CompressedTensorsConfig reads it. vLLM silently takes the first shard's scheme for a fused module, then fails
     at load with a bare shape assertion, so a mismatch is reported here by name.
  3. load: initialize_model() + model.load_weights() (AutoWeightsLoader with the Llama name mapper, stacking
     q/k/v and gate/up), then every quantized module's loaded integers, zero points and scales dequantized and
     compared with the checkpoint's tensors. process_weights_after_loading (Marlin/Machete repacking, CUDA ops)
     is not called: what a GPU run would still have to confirm is that repack and the kernels themselves.

Platform: vLLM's current_platform is replaced before vLLM binds it by one whose compute capability is sm90 and whose
identity is "unspecified" (so CUDA-only custom ops and flash-attention are not imported); it answers is_cuda() only
while the quantization config picks schemes and creates weights, so vLLM's kernel chooser walks its CUDA kernel list
and runs its Python can_implement checks (Machete on sm90, Marlin on sm75-89; `--capability 8.0`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
import traceback

T0 = time.perf_counter()
_STDOUT = os.dup(1)
os.dup2(2, 1)  # vLLM (and the subprocess that inspects the model) print to stdout; the report owns it
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import vllm.platforms as _platforms  # noqa: E402
from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum  # noqa: E402

CAPABILITY = [9, 0]
FUSED = {"qkv_proj": ("self_attn", ["q_proj", "k_proj", "v_proj"]), "gate_up_proj": ("mlp", ["gate_proj", "up_proj"]),
         "o_proj": ("self_attn", ["o_proj"]), "down_proj": ("mlp", ["down_proj"])}


class FakeGpuPlatform(Platform):
    """CPU tensors and an 'unspecified' identity, with a CUDA compute capability for Python-level checks."""

    _enum = PlatformEnum.UNSPECIFIED
    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"

    @classmethod
    def get_device_capability(cls, device_id: int = 0):
        return DeviceCapability(*CAPABILITY)

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return f"fake-sm{CAPABILITY[0]}{CAPABILITY[1]}"

    @classmethod
    def get_attn_backend_cls(cls, *args, **kwargs) -> str:
        return "vllm.v1.attention.backends.flex_attention.FlexAttentionBackend"  # built, never run


_platforms._current_platform = FakeGpuPlatform()


@contextlib.contextmanager
def as_cuda():
    old = FakeGpuPlatform._enum
    FakeGpuPlatform._enum = PlatformEnum.CUDA
    try:
        yield
    finally:
        FakeGpuPlatform._enum = old


def _cuda_while(cls, name: str) -> None:
    fn = getattr(cls, name)

    def wrapped(*a, **k):
        with as_cuda():
            return fn(*a, **k)

    setattr(cls, name, wrapped)


def describe_error(e: BaseException) -> dict:
    """Type, message and the innermost vLLM frame (with its source line: vLLM's asserts carry no message)."""
    tb = traceback.extract_tb(e.__traceback__)
    frame = next((f for f in reversed(tb) if "/vllm/" in f.filename), tb[-1] if tb else None)
    out = {"type": type(e).__name__, "message": str(e)[:1000]}
    if frame is not None:
        out["where"] = f"vllm/{frame.filename.split('/vllm/', 1)[-1]}:{frame.lineno} ({frame.name})"
        if not str(e):
            out["code"] = (frame.line or "").strip()
    return out


# ---- dequantization, independent of vLLM and compressed-tensors -------------------------------------------------

def _unpack(packed: torch.Tensor, bits: int, rows: int, cols: int, dim: int = 1) -> torch.Tensor:
    """32/bits signed values per int32 (stored + 2**(bits-1), lowest bits first), packed along `dim`."""
    x = packed.to(torch.int64) & 0xFFFFFFFF
    x = x if dim == 1 else x.t()
    shifts = torch.arange(32 // bits, dtype=torch.int64) * bits
    v = ((x.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(x.shape[0], -1) - (1 << (bits - 1))
    return v[:rows, :cols] if dim == 1 else v[:cols, :rows].t()


def dequantize(t: dict, bits: int, scale_dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 weight [rows, cols], integer values and zero points) from one module's packed tensors."""
    rows, cols = t["weight_packed"].shape[0], t["weight_packed"].shape[1] * 32 // bits
    q = _unpack(t["weight_packed"], bits, rows, cols)
    scale = t["weight_scale"].to(scale_dtype or t["weight_scale"].dtype).float().reshape(rows, -1)
    per = cols // scale.shape[1]
    zp = torch.zeros_like(q)
    if "weight_zero_point" in t:
        zp = _unpack(t["weight_zero_point"], bits, rows, scale.shape[1], dim=0).repeat_interleave(per, dim=1)
    return (q - zp).float() * scale.repeat_interleave(per, dim=1), torch.stack([q, zp])


def compare_module(module, ckpt: dict, hf_prefix: str, shards: list[str]) -> dict:
    """The module's loaded params vs its HF shards' checkpoint tensors (scales cast to the serving dtype first:
    that cast is the only difference a correct load may show)."""
    params = {n: p.detach() for n, p in module.named_parameters(recurse=False)}
    bits = module.scheme.num_bits
    got_w, got_q = dequantize(params, bits)
    ref_w, ref_q = [], []
    for s in shards:
        pre = f"{hf_prefix}.{s}." if s else f"{hf_prefix}."
        t = {k[len(pre):]: v for k, v in ckpt.items() if k.startswith(pre)}
        w, q = dequantize(t, bits, params["weight_scale"].dtype)
        ref_w.append(w)
        ref_q.append(q)
    ref_w, ref_q = torch.cat(ref_w), torch.cat(ref_q, dim=1)
    if got_w.shape != ref_w.shape:
        return {"error": f"shape {list(got_w.shape)} != checkpoint {list(ref_w.shape)}"}
    return {"ints_equal": bool(torch.equal(got_q, ref_q)), "max_abs_diff": float((got_w - ref_w).abs().max())}


# ---- the check ----------------------------------------------------------------------------------------------------

def fused_shard_schemes(qc, num_layers: int) -> dict:
    """{fused module: {shard: scheme}} for every fused module whose shards vLLM reads as different schemes."""
    out = {}
    for i in range(num_layers):
        for fused, (parent, shards) in FUSED.items():
            if len(shards) < 2:
                continue
            per = {}
            for s in shards:
                d = qc.get_scheme_dict(torch.nn.Module(), f"model.layers.{i}.{parent}.{s}") or {}
                w = d.get("weights")
                per[s] = None if w is None else f"{d.get('format')}:{w.num_bits}b/{w.strategy}/" \
                                                f"{'sym' if w.symmetric else 'asym'}"
            if len(set(per.values())) > 1:
                out[f"model.layers.{i}.{parent}.{fused}"] = per
    return out


def check(export: str, dtype: str, speculative_config: dict | None = None) -> dict:
    import vllm
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    rep: dict = {"export": export, "vllm": vllm.__version__, "torch": torch.__version__, "dtype": dtype,
                 "platform": f"CPU tensors, sm{CAPABILITY[0]}{CAPABILITY[1]} capability checks", "ok": False}
    ea = EngineArgs(model=export, tokenizer=export, dtype=dtype, enforce_eager=True, load_format="safetensors",
                    disable_log_stats=True, speculative_config=speculative_config)
    try:
        mc, lc = ea.create_model_config(), ea.create_load_config()
        with as_cuda():
            qc = VllmConfig._get_quantization_config(mc, lc)
        vc = ea.create_engine_config()
    except Exception as e:  # noqa: BLE001 - vLLM refuses the config: that is the answer
        rep["config"] = {"ok": False, "error": describe_error(e)}
        return rep
    rep["config"] = {"ok": True, "quantization": mc.quantization, "quant_config": type(qc).__name__ if qc else None,
                     "speculative_config": None if vc.speculative_config is None else
                     {"method": vc.speculative_config.method,
                      "num_speculative_tokens": vc.speculative_config.num_speculative_tokens}}
    if qc is None:
        rep["ok"] = True
        return rep

    from safetensors.torch import load_file
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig, CompressedTensorsLinearMethod)
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    for name in ("get_quant_method", "get_scheme"):
        _cuda_while(CompressedTensorsConfig, name)
    _cuda_while(CompressedTensorsLinearMethod, "create_weights")
    rep["fused_mismatches"] = fused_shard_schemes(qc, mc.hf_config.num_hidden_layers)

    ckpt: dict = {}
    for f in sorted(os.listdir(export)):
        if f.endswith(".safetensors"):
            ckpt.update(load_file(os.path.join(export, f)))
    load: dict = {}
    rep["load"] = load
    with set_current_vllm_config(vc):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)
        try:
            with set_default_torch_dtype(mc.dtype), torch.device("cpu"):
                model = initialize_model(vllm_config=vc)
            loader = get_model_loader(vc.load_config)
            loader.counter_before_loading_weights = time.perf_counter()
            loaded = set(model.load_weights(loader.get_all_weights(mc, model)) or ())
        except Exception as e:  # noqa: BLE001
            load.update(ok=False, error=describe_error(e))
            return rep
        kv_defaults = (".attn.q_scale", ".attn.k_scale", ".attn.v_scale", "_zero_point")
        load["params_not_loaded"] = sorted(n for n, _ in model.named_parameters()
                                           if n not in loaded and not n.endswith(kv_defaults))[:20]
        modules, schemes = {}, {}
        for name, mod in model.named_modules():
            if not hasattr(mod, "weight_packed"):
                continue
            parent, leaf = name.rsplit(".", 1) if "." in name else ("", name)
            hf_prefix, shards = (parent, FUSED[leaf][1]) if leaf in FUSED else (name, [""])
            kind = f"{type(mod.scheme).__name__}({mod.scheme.num_bits}b)"
            schemes[kind] = schemes.get(kind, 0) + 1
            modules[name] = compare_module(mod, ckpt, hf_prefix, shards)
        load.update(ok=True, quantized_modules=len(modules), schemes=schemes,
                    ints_equal=all(m.get("ints_equal") for m in modules.values()),
                    max_abs_diff=max((m.get("max_abs_diff", float("inf")) for m in modules.values()), default=0.0),
                    errors={n: m["error"] for n, m in modules.items() if "error" in m})
    rep["ok"] = (not rep["fused_mismatches"] and load["ok"] and not load["params_not_loaded"] and load["ints_equal"]
                 and not load["errors"] and load["max_abs_diff"] == 0.0)
    return rep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir")
    ap.add_argument("--dtype", default="bfloat16", help="the serving dtype (scales are cast to it on load)")
    ap.add_argument("--capability", default="9.0", help="the CUDA compute capability to check for (9.0, 8.0, ...)")
    ap.add_argument("--speculative-config", help="JSON of `vllm serve --speculative-config`, parsed by vLLM too")
    args = ap.parse_args()
    CAPABILITY[:] = [int(x) for x in args.capability.split(".")]
    spec = json.loads(args.speculative_config) if args.speculative_config else None
    try:
        rep = check(os.path.abspath(args.export_dir), args.dtype, spec)
    except Exception as e:  # noqa: BLE001 - a failure of the check itself, reported as such
        rep = {"ok": False, "fatal": describe_error(e), "traceback": traceback.format_exc()[-2000:]}
    rep["seconds"] = round(time.perf_counter() - T0, 1)
    os.write(_STDOUT, (json.dumps(rep, indent=1, default=str) + "\n").encode())
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return 0 if rep.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
