"""Progress bars: one rich bar with an ETA per long loop, advanced by hooks on the work itself (no clock)."""

from __future__ import annotations

import io

import torch
from rich.console import Console

from accel.progress import Bar, forward_progress
from tests.conftest import make_tiny_llama


def test_a_bar_draws_its_description_count_and_eta_and_a_disabled_one_nothing():
    out = io.StringIO()
    with Bar(4, "sensitivity", True, console=Console(file=out, width=120, force_terminal=False)) as b:
        b.update(3)
        b.set_postfix(kl="0.0012")
        b.update(1)
    text = out.getvalue()
    assert "sensitivity kl=0.0012" in text and "4/4" in text and "ETA" in text
    off = Bar(4, "hidden", False)
    off.update(2)
    off.close()
    assert off.done == 2


def test_forward_progress_counts_layers_of_a_sequential_walk_and_rows_of_whole_forwards():
    model = make_tiny_llama().eval()
    layers = model.model.layers
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        h = model.model.embed_tokens(ids)
        pos = torch.arange(4)[None]
        emb = model.model.rotary_emb(h, pos)
        with forward_progress(model, "smoothquant+gptq (layers)", False, passes=2) as b:
            for walk in range(2):  # each modifier walks the layers once
                for i, layer in enumerate(layers):  # layer by layer, as a sequential pipeline walks them
                    for _ in range(3):  # each layer takes every calibration row before the next starts
                        layer(h, position_embeddings=emb, position_ids=pos)
                        assert b.done == walk * len(layers) + i  # the layers before this one are done
        assert b.done == b.total == 2 * len(layers)
        with forward_progress(model, "gptq (calibration rows)", False, rows=5) as b:
            for _ in range(5):
                model(ids)
        assert b.done == 5
    assert all(not layer._forward_pre_hooks for layer in layers)  # the hooks are gone
