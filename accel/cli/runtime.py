"""`accel serve`, `accel generate` and `accel bench`: the runtime's commands."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from accel.cli.common import QUANT_CHOICES, QUANT_HELP, console, err_console, fail, int_pair, quant_kwargs
from accel.cli.options import build_config, config_options
from accel.runtime.config import RuntimeConfig
from accel.server.config import API_KEY_ENV, ServerConfig


def _speculative_help() -> str:
    from dataclasses import fields

    from accel.speculative.config import SpeculativeConfig

    return ("Speculative decoding, as vLLM's flag: a JSON object of SpeculativeConfig's fields, e.g. "
            "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}' or '{\"draft_model\": \"runs/default/draft\"}' "
            f"(fields: {', '.join(f.name for f in fields(SpeculativeConfig))}). Default: an export's own drafter; "
            "'{\"method\": \"none\"}' serves without.")


@config_options(ServerConfig, dest="server")
@config_options(RuntimeConfig, dest="runtime")
def serve(
    model: Annotated[str, typer.Argument(help="Model name, HF folder, .gguf file or exported checkpoint.")],
    speculative_config: Annotated[Optional[str], typer.Option(help=_speculative_help())] = None,
    quant: Annotated[Optional[str], typer.Option(help=QUANT_HELP)] = None,
    quant_group_size: Annotated[int, typer.Option(help="INT4 group size for --quant int4 / int4f.")] = 64,
    runtime: Optional[dict] = None,
    server: Optional[dict] = None,
) -> None:
    """Serve a model through the embedded runtime behind an OpenAI-compatible HTTP API. The server's options are
    ServerConfig's fields, the runtime's RuntimeConfig's (the recipe's `runtime:` fields), with their defaults."""
    from accel.hub import ModelNotFoundError, resolve_model
    from accel.server import run_server
    from accel.server.serve import speculative_config as parse_speculative_config

    if quant not in QUANT_CHOICES:
        fail(f"--quant {quant!r} is invalid; allowed: {', '.join(q for q in QUANT_CHOICES if q)}")
    try:
        settings = build_config(RuntimeConfig, runtime or {})
        given = server or {}
        if given.get("api_key") is None and os.environ.get(API_KEY_ENV):
            given = {**given, "api_key": os.environ[API_KEY_ENV]}
        http = build_config(ServerConfig, given)
        quant_fields = quant_kwargs(resolve_model(model), quant, quant_group_size) if quant else {}
        if speculative_config is not None:
            parse_speculative_config(speculative_config)  # a bad value fails here, before any weight is read
    except (ModelNotFoundError, ValueError) as e:
        fail(str(e))
    try:
        run_server(model, server=http, speculative=speculative_config, **settings.runtime_fields(), **quant_fields)
    except (ModelNotFoundError, ValueError) as e:
        fail(str(e))


def generate(
    model: Annotated[str, typer.Argument(help="Model name, HF folder or .gguf file.")],
    prompt: Annotated[str, typer.Argument(help="The prompt (a user message unless --raw).")],
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option()] = 1.0,
    top_k: Annotated[Optional[int], typer.Option()] = None,
    seed: Annotated[Optional[int], typer.Option()] = None,
    raw: Annotated[bool, typer.Option(help="Send the prompt as is, without the chat template.")] = False,
    quant: Annotated[Optional[str], typer.Option(help=QUANT_HELP)] = None,
    quant_group_size: Annotated[int, typer.Option(help="INT4 group size for --quant int4 / int4f.")] = 64,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
) -> None:
    """Generate text for one prompt with the embedded runtime, streaming to the terminal."""
    from accel.memory import MemoryLimitError, peak_line
    from accel.hub import ModelNotFoundError, resolve_model
    from accel.runtime.engine import Engine
    from accel.runtime.sampling_params import SamplingParams

    if quant not in QUANT_CHOICES:
        fail(f"--quant {quant!r} is invalid; allowed: {', '.join(q for q in QUANT_CHOICES if q)}")
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        path = resolve_model(model)
    except (ValueError, ModelNotFoundError) as e:
        fail(str(e))
    try:
        engine = Engine.from_pretrained(path, device=device, max_num_seqs=1,
                                        **quant_kwargs(path, quant, quant_group_size))
    except MemoryLimitError as e:
        fail(str(e))
    tok = engine.tokenizer
    if tok is None:
        fail(f"{path} has no tokenizer files; accel generate needs one")
    text = prompt if raw or not tok.chat_template else tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    rid = engine.add_request(tok(text, add_special_tokens=False).input_ids, params)
    final = None
    try:
        while final is None and engine.has_unfinished():
            for o in engine.step():
                if o.request_id == rid:
                    print(o.text_delta, end="", flush=True)
                    final = o if o.finished else None
    finally:
        engine.abort(rid)  # no-op when finished
    print()
    # tokens, not text chunks: greedy decoding delivers several tokens a step (multi-step decode)
    m = final.metrics if final is not None else None
    ttft = f"TTFT {1000 * m.ttft:.0f} ms" if m is not None and m.ttft is not None else "no tokens generated"
    tpot = m.tpot if m is not None else None
    rate = f", {1 / tpot:.1f} tok/s after the first" if tpot else ""
    err_console.print(f"[dim]{ttft}, {len(final.token_ids) if final else 0} tokens{rate}; "
                      f"{peak_line('', engine.memory())}[/]")


def bench(
    url: Annotated[Optional[str], typer.Option(help="Base URL of an OpenAI-compatible server (ours, vLLM, "
                                                    "llama.cpp); omit to run the runtime in-process.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model name sent to the server, or the model to load "
                                                      "in-process.")] = None,
    concurrency: Annotated[Optional[int], typer.Option(min=1, help="Requests in flight.")] = None,
    rate: Annotated[Optional[float], typer.Option(min=0.0, help="Arrivals per second instead of a concurrency.")] = None,
    arrival: Annotated[str, typer.Option(help="poisson or gamma.")] = "poisson",
    burstiness: Annotated[float, typer.Option(min=0.01, help="Gamma shape (1 = Poisson).")] = 1.0,
    num_requests: Annotated[int, typer.Option(min=1)] = 32,
    prompt_tokens: Annotated[str, typer.Option(help="MIN,MAX prompt tokens (long-tailed).")] = "16,1024",
    output_tokens: Annotated[str, typer.Option(help="MIN,MAX output tokens.")] = "16,256",
    warmup: Annotated[int, typer.Option(min=0, help="Requests sent first and left out of the stats.")] = 2,
    slo_ttft_ms: Annotated[Optional[float], typer.Option(help="TTFT SLO for goodput.")] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option(help="TPOT SLO for goodput.")] = None,
    sweep: Annotated[Optional[str], typer.Option(help="Comma-separated concurrencies to sweep (finds the knee).")] = None,
    endpoint: Annotated[str, typer.Option(help="completions or chat.")] = "completions",
    api_key: Annotated[Optional[str], typer.Option(envvar="ACCEL_API_KEY")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[Optional[Path], typer.Option(help="Write the result JSON here.")] = None,
    report: Annotated[Optional[Path], typer.Option(help="Write a Markdown + HTML report into this folder.")] = None,
) -> None:
    """Load-test the runtime in-process or any OpenAI-compatible endpoint with one workload."""
    import sys

    from accel.bench.loadgen import bench as run

    if url is None and model is None:
        fail("give --url (a server) or --model (run in-process)")
    if arrival not in ("poisson", "gamma"):
        fail(f"--arrival {arrival!r} is invalid; allowed: poisson, gamma")
    if endpoint not in ("completions", "chat"):
        fail(f"--endpoint {endpoint!r} is invalid; allowed: completions, chat")
    if concurrency is not None and rate is not None:
        fail("give --concurrency or --rate, not both")
    try:
        sweep_list = [int(x) for x in sweep.split(",")] if sweep else None
    except ValueError:
        fail(f"--sweep {sweep!r} is invalid; expected comma-separated integers")
    res = run(url=url, model=model or "default", concurrency=concurrency, rate=rate, arrival=arrival,
              burstiness=burstiness, num_requests=num_requests, prompt_tokens=int_pair(prompt_tokens, "prompt-tokens"),
              output_tokens=int_pair(output_tokens, "output-tokens"), warmup=warmup, slo_ttft_ms=slo_ttft_ms,
              slo_tpot_ms=slo_tpot_ms, seed=seed, sweep=sweep_list, out=out, api_key=api_key, endpoint=endpoint)
    if report is not None:
        from accel.report import build_report, report_from_bench

        md, html = build_report(report_from_bench(res, command=" ".join(sys.argv)), report)
        console.print(f"report: {md} {html}")
