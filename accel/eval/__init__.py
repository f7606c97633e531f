"""accel.eval: quality metrics (perplexity, KL vs a baseline, top-1 agreement, task accuracy).

The text protocol is documented in `accel.eval.text_protocol`; `run_eval` is the entry point the CLI calls and
`render_table` prints its result.
"""

from accel.eval.adapters import EvalModel, GenerateFn, LogitsFn, from_hf, hf_generate_fn, hf_logits_fn, load_eval_model
from accel.eval.data import TaskExample, TextDoc, load_tasks, load_texts
from accel.eval.metrics import PositionStats, TextMetrics, position_stats, summarize
from accel.eval.text_protocol import EvalProtocol, Window, make_windows
from accel.eval.result import EvalResult, TaskMetrics, TaskRecord, TaskScores
from accel.eval.runner import evaluate_text, run_eval, score_tasks
from accel.eval.scoring import accuracy_stderr, extract_choice, extract_json_object, extract_number, score_reply
from accel.eval.table import render_table

__all__ = [
    "EvalModel", "GenerateFn", "LogitsFn", "from_hf", "hf_generate_fn", "hf_logits_fn", "load_eval_model",
    "TaskExample", "TextDoc", "load_tasks", "load_texts",
    "PositionStats", "TextMetrics", "position_stats", "summarize",
    "EvalProtocol", "Window", "make_windows",
    "EvalResult", "TaskMetrics", "TaskRecord", "TaskScores",
    "evaluate_text", "run_eval", "score_tasks",
    "accuracy_stderr", "extract_choice", "extract_json_object", "extract_number", "score_reply",
    "render_table",
]
