"""`run_eval`: perplexity, KL and top-1 agreement on held-out text, and task accuracy, for a model vs a baseline.

Text is streamed window by window: the baseline and every variant run on the same window, the per-position
statistics (a few floats per token) are kept and the [T, V] logits are dropped, so memory does not grow with
the eval set and the baseline forward is shared by all variants of one call (`evaluate_text`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import torch

from accel.eval.adapters import EvalModel, GenerateFn, LogitsFn, load_eval_model
from accel.eval.data import TaskExample, load_tasks, load_texts
from accel.eval.metrics import PositionStats, TextMetrics, concat_stats, position_stats, summarize
from accel.eval.text_protocol import DEFAULT_WINDOW, EvalProtocol, Window, make_windows, tokenize_domain
from accel.eval.result import EvalResult, TaskMetrics, TaskRecord, TaskScores
from accel.eval.scoring import accuracy_stderr, answer_letter, score_reply
from accel.progress import bar

DEFAULT_MAX_NEW_TOKENS = 64
# Defaults sized so baseline + one variant of SmolLM2-135M fit the 5-minute budget on 2 CPU cores
# (scripts/bench_eval.py measures it): 4 windows x 6 domains ~ 12k scored tokens, 20 examples x 5 tasks.
DEFAULT_MAX_WINDOWS_PER_DOMAIN = 4
DEFAULT_MAX_EXAMPLES_PER_TASK = 20


def task_token_budget(examples: Sequence[TaskExample], tokenizer: Any, cap: int) -> int:
    """max_new_tokens for one task: min(cap, 2 x the longest reference answer in tokens + 8).

    Why: greedy decoding of a batch runs until every row stops, and small models often ramble to the cap.
    A reply longer than twice the reference cannot exact-match it, and the first number / letter / JSON object
    a scorer looks for sits at the start, so the shorter budget changes no score in practice and saves most of
    the decode time. The budget is recorded per task in the result.
    """
    longest = max(len(tokenizer.encode(str(e.answer), add_special_tokens=False)) for e in examples)
    return min(cap, 2 * longest + 8)


def build_windows(
    texts_by_domain: dict[str, list[str]], tokenizer: Any, protocol: EvalProtocol
) -> dict[str, list[Window]]:
    """Tokenize and window every domain as `protocol` says."""
    return {
        domain: make_windows(
            tokenize_domain(texts, tokenizer, protocol.separator_id),
            domain,
            protocol.window,
            protocol.stride,
            protocol.max_windows_per_domain,
        )
        for domain, texts in texts_by_domain.items()
    }


def _batches(windows: list[Window], batch_size: int) -> list[list[Window]]:
    """Consecutive windows of equal length grouped into batches (a short tail window goes alone)."""
    out: list[list[Window]] = []
    for w in windows:
        if out and len(out[-1]) < batch_size and len(out[-1][0].token_ids) == len(w.token_ids):
            out[-1].append(w)
        else:
            out.append([w])
    return out


def _logits(fn: LogitsFn, ids: torch.Tensor) -> torch.Tensor:
    out = fn(ids)
    if out.dim() != 3 or out.shape[:2] != ids.shape:
        raise ValueError(f"logits function returned shape {tuple(out.shape)} for input {tuple(ids.shape)}; want [B, T, V]")
    return out


def evaluate_text(
    windows_by_domain: dict[str, list[Window]],
    models: Sequence[LogitsFn],
    baseline: LogitsFn | None = None,
    *,
    batch_size: int = 1,
    progress: bool = True,
) -> list[dict[str, PositionStats]]:
    """Per-position stats per domain for each model; the baseline runs once per window for all of them."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    per_model: list[dict[str, list[PositionStats]]] = [{d: [] for d in windows_by_domain} for _ in models]
    total = sum(len(ws) for ws in windows_by_domain.values())
    with bar(total, "text windows", progress) as b:
        for domain, windows in windows_by_domain.items():
            b.set_postfix(domain=domain)
            for batch in _batches(windows, batch_size):
                ids = torch.tensor([w.token_ids for w in batch], dtype=torch.long)  # [B, T]
                base = _logits(baseline, ids).cpu() if baseline is not None else None  # [B, T, V]
                for m, fn in enumerate(models):
                    logits = _logits(fn, ids).cpu()  # [B, T, V]
                    for r, w in enumerate(batch):
                        # Logits at j-1 predict token j; targets are token_ids[score_from:].
                        rows = slice(w.score_from - 1, len(w.token_ids) - 1)
                        per_model[m][domain].append(
                            position_stats(
                                logits[r, rows], ids[r, w.score_from :], base[r, rows] if base is not None else None
                            )
                        )
                b.update(len(batch))
    return [{d: concat_stats(parts) for d, parts in stats.items() if parts} for stats in per_model]


def summarize_text(
    stats: dict[str, PositionStats], windows_by_domain: dict[str, list[Window]]
) -> tuple[dict[str, TextMetrics], TextMetrics | None]:
    """Per-domain metrics, and the overall metrics pooled over every scored token of every domain."""
    domains = {d: summarize(s, len(windows_by_domain[d])) for d, s in stats.items()}
    if not stats:
        return domains, None
    pooled = concat_stats(list(stats.values()))
    return domains, summarize(pooled, sum(len(windows_by_domain[d]) for d in stats))


def generate_replies(
    tasks: dict[str, list[TaskExample]], generate_fn: GenerateFn, budgets: dict[str, int], progress: bool = True
) -> dict[str, list[str]]:
    """Greedy replies per task, in example order; `budgets[task]` is its max_new_tokens."""
    out = {}
    with bar(len(tasks), "tasks", progress) as b:
        for task, examples in tasks.items():
            replies = generate_fn([e.prompt for e in examples], budgets[task])
            if len(replies) != len(examples):
                raise ValueError(f"generate_fn returned {len(replies)} replies for {len(examples)} prompts of "
                                 f"{task!r}")
            out[task] = replies
            b.update(1)
    return out


CHOICE_LETTERS = "ABCD"
LOGLIK_SUFFIX = ":loglik"  # the task name of a choice task's log-likelihood score


@torch.inference_mode()
def choice_logliks(examples: Sequence[TaskExample], tokenizer: Any, logits_fn: LogitsFn) -> list[list[float]]:
    """Per example with `choices`, the log-likelihood of each option letter after the raw prompt, as
    lm-evaluation-harness scores a multiple_choice task through a completions API: the continuation " X" is the
    tokens of prompt + " X" after those of the prompt, both encoded without special tokens, and its log-likelihood
    the sum of the log-softmax at those tokens (eval/lm_eval/ defines the same items as lm-eval tasks)."""
    out = []
    for e in examples:
        ctx = tokenizer(e.prompt, add_special_tokens=False).input_ids
        scores = []
        for letter in CHOICE_LETTERS[: len(e.choices or ())]:
            whole = tokenizer(f"{e.prompt} {letter}", add_special_tokens=False).input_ids
            logp = logits_fn(torch.tensor([whole[:-1]]))[0].float().log_softmax(-1)  # [T - 1, V]
            scores.append(sum(float(logp[i - 1, whole[i]]) for i in range(len(ctx), len(whole))))
        out.append(scores)
    return out


def score_choice_logliks(examples: Sequence[TaskExample], tokenizer: Any, logits_fn: LogitsFn,
                         base_logits_fn: LogitsFn | None = None) -> TaskMetrics:
    """A choice task scored by log-likelihood: an example is right when its answer's letter has the highest
    log-likelihood (the first of equals)."""
    def picks(fn: LogitsFn) -> list[str]:
        return [CHOICE_LETTERS[max(range(len(s)), key=s.__getitem__)] for s in choice_logliks(examples, tokenizer, fn)]

    letters = [answer_letter(e.answer) for e in examples]
    mine = picks(logits_fn)
    base = picks(base_logits_fn) if base_logits_fn is not None else None
    ok = [m == a for m, a in zip(mine, letters)]
    base_ok = [b == a for b, a in zip(base, letters)] if base else None
    records = [TaskRecord(e.id, ok[i], mine[i], base_ok[i] if base_ok else None, base[i] if base else None)
               for i, e in enumerate(examples)]
    return TaskMetrics(examples[0].task + LOGLIK_SUFFIX, _scores(ok), _scores(base_ok) if base_ok else None, records)


def _scores(correct: list[bool]) -> TaskScores:
    p, se = accuracy_stderr(sum(correct), len(correct))
    return TaskScores(len(correct), sum(correct), p, se)


def score_tasks(
    tasks: dict[str, list[TaskExample]],
    replies: dict[str, list[str]],
    baseline_replies: dict[str, list[str]] | None = None,
    budgets: dict[str, int] | None = None,
) -> tuple[dict[str, TaskMetrics], TaskMetrics | None]:
    """Per-task accuracy with standard error, and the pooled accuracy over all examples ("overall")."""
    per_task: dict[str, TaskMetrics] = {}
    all_ok: list[bool] = []
    all_base_ok: list[bool] = []
    for task, examples in tasks.items():
        if not examples:
            continue
        ok = [score_reply(r, e.answer, e.match) for r, e in zip(replies[task], examples)]
        base_r = baseline_replies[task] if baseline_replies is not None else None
        base_ok = [score_reply(r, e.answer, e.match) for r, e in zip(base_r, examples)] if base_r else None
        records = [
            TaskRecord(e.id, ok[i], replies[task][i], base_ok[i] if base_ok else None, base_r[i] if base_r else None)
            for i, e in enumerate(examples)
        ]
        per_task[task] = TaskMetrics(
            task, _scores(ok), _scores(base_ok) if base_ok else None, records, (budgets or {}).get(task)
        )
        all_ok += ok
        all_base_ok += base_ok or []
    if not all_ok:
        return per_task, None
    return per_task, TaskMetrics("overall", _scores(all_ok), _scores(all_base_ok) if all_base_ok else None)


def run_eval(
    model_path_or_obj: str | Path | Any,
    baseline: str | Path | Any | None = None,
    *,
    text_dir: str | Path = "eval/text",
    tasks_dir: str | Path = "eval/tasks",
    domains: Sequence[str] | None = None,
    window: int = DEFAULT_WINDOW,
    stride: int | None = None,
    max_windows_per_domain: int | None = DEFAULT_MAX_WINDOWS_PER_DOMAIN,
    tasks: bool | Sequence[str] = True,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_examples_per_task: int | None = DEFAULT_MAX_EXAMPLES_PER_TASK,
    baseline_tasks: bool = True,
    batch_size: int = 1,
    device: str = "cpu",
    tokenizer: Any = None,
    progress: bool = True,
) -> EvalResult:
    """Evaluate a model (path, registry name, HF model or EvalModel), optionally against a baseline.

    Text metrics follow the protocol in `accel.eval.text_protocol`; `tasks=True` runs every task file, a list runs
    the named ones, False none. The model's tokenizer is used for the text of both models (they must share the
    vocabulary). Without a baseline only perplexity and the model's task accuracy are reported.
    `max_windows_per_domain` / `max_examples_per_task` = None use all the data; the defaults keep the run
    within the 5-minute budget on 2 CPU cores. `max_new_tokens` caps each task's budget (`task_token_budget`);
    `baseline_tasks=False` skips generating with the baseline.
    """
    started = time.perf_counter()
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens!r}")
    if max_examples_per_task is not None and max_examples_per_task < 1:
        raise ValueError(f"max_examples_per_task must be None or >= 1, got {max_examples_per_task!r}")
    model = load_eval_model(model_path_or_obj, tokenizer=tokenizer, device=device)
    base = load_eval_model(baseline, tokenizer=tokenizer, device=device) if baseline is not None else None
    protocol = EvalProtocol(
        window=window,
        stride=window if stride is None else stride,
        max_windows_per_domain=max_windows_per_domain,
        separator_id=model.separator_id,
    )

    texts = {d: [doc.text for doc in docs] for d, docs in load_texts(text_dir, domains).items()}
    windows = build_windows(texts, model.tokenizer, protocol)
    [stats] = evaluate_text(
        windows, [model.logits_fn], base.logits_fn if base else None, batch_size=batch_size, progress=progress
    )
    per_domain, overall = summarize_text(stats, windows)

    task_metrics: dict[str, TaskMetrics] = {}
    tasks_overall = None
    if tasks:
        examples = load_tasks(tasks_dir, None if tasks is True else list(tasks))
        if max_examples_per_task is not None:
            examples = {t: ex[:max_examples_per_task] for t, ex in examples.items()}
        if model.generate_fn is None:
            raise ValueError(f"model {model.name!r} has no generate_fn; pass tasks=False or provide one")
        examples = {t: ex for t, ex in examples.items() if ex}
        budgets = {t: task_token_budget(ex, model.tokenizer, max_new_tokens) for t, ex in examples.items()}
        replies = generate_replies(examples, model.generate_fn, budgets, progress)
        base_replies = (
            generate_replies(examples, base.generate_fn, budgets, progress)
            if baseline_tasks and base is not None and base.generate_fn is not None
            else None
        )
        task_metrics, tasks_overall = score_tasks(examples, replies, base_replies, budgets)
        for task, ex in examples.items():  # a choice task is also scored by log-likelihood (not pooled)
            if all(e.choices for e in ex):
                m = score_choice_logliks(ex, model.tokenizer, model.logits_fn, base.logits_fn if base else None)
                task_metrics[m.task] = m

    return EvalResult(
        model=model.name,
        baseline=base.name if base else None,
        protocol=protocol,
        domains=per_domain,
        overall=overall,
        tasks=task_metrics,
        tasks_overall=tasks_overall,
        max_new_tokens=max_new_tokens if tasks else None,
        elapsed_s=time.perf_counter() - started,
    )
