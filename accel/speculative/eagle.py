"""EAGLE-style feature draft (Li et al., 2024): one decoder layer over the target's own last hidden states.

Why: a separate 2-layer draft distilled on this 2-core CPU within 30 minutes agrees with SmolLM2-135M's greedy
token about 1 time in 5 (it has to re-derive from tokens what 30 layers computed). The target's final hidden
state f_i already holds that; a draft that reads it only has to predict one step further. Both trained for 30
minutes, on held-out eval prompts (`scripts/draft_agreement.py`): 0.40 / 0.35 first-token agreement (chat /
chat + instructions) against 0.21 / 0.23 for the 2-layer token draft.

The draft, per position i of a request (x: the target's tokens, f: the target's final normed hidden states):

    input_i  = fc([embed(x_{i+1}) ; f_i])          fc: Linear(2H -> H, bias), embed: the target's (shared)
    h_i      = norm(layer(input_i | inputs before i))  one Llama decoder layer with its own (1-layer) paged KV
    h_i ~ f_{i+1}        ->  d = argmax(head_K @ h_i)  a guess of x_{i+2}; head_K: trained rows of the
                                                        draft vocabulary (`accel_draft.json` vocab_ids)

Drafting k tokens after the target sampled x_t: catch up positions up to t-1 with the real f (read from the
target runner's feature cache, `ModelRunner.feature_cache`, filled by slot like the KV cache, so prefix-cached
and swapped blocks keep theirs), then chain: position t takes (embed(d_0), h_{t-1}) instead of a real feature,
and so on. Positions fed with a predicted feature are recomputed with the real one once verified (the rollback
keeps only positions computed from real features).

Folder (`save_eagle_draft`): the target's config with num_hidden_layers=1 and architectures
["EagleLlamaForCausalLM"], model.safetensors with fc.*, model.layers.0.*, model.norm.weight and lm_head.weight
([K, H], the draft vocabulary's rows only; no embedding: the target's is used), the tokenizer, accel_draft.json
{"method": "eagle", "vocab_ids": [...]} — accel's own layout; transformers and vLLM do not load it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from accel.runtime.models import CausalLM, NativeDecode, fuse_projections
from accel.runtime.sequence import Sequence
from accel.speculative.paged_draft import _GREEDY, PagedDraftProposer
from accel.speculative.proposer import DRAFT_META_FILE, TOKENIZER_FILES, ProposalRequest
from accel.speculative.tokenizer_check import check_tokenizers_match

EAGLE_METHOD = "eagle"
EAGLE_ARCHITECTURE = "EagleLlamaForCausalLM"
DEFAULT_CONTEXT_WINDOW = 128


def draft_layer_config(target_config):
    """The draft's config: the target's own, one layer, where the runtime's Llama stack runs the target's layer
    (Llama, Mistral, Qwen2/3, Phi-3); otherwise (Gemma 3) a Llama layer of the target's widths. Why: the draft
    reads only the target's table and final features, so its layer need not be the target's kind, and one
    runtime class (`EagleDraft`, the native step) serves every family."""
    from transformers import LlamaConfig

    from accel.runtime.models.llama import SUPPORTED_MODEL_TYPES

    if target_config.model_type in SUPPORTED_MODEL_TYPES:
        cfg = target_config.to_dict()
        cfg.update(num_hidden_layers=1, tie_word_embeddings=False)
        cfg.pop("layer_types", None)
        cfg.pop("architectures", None)
        return type(target_config).from_dict(cfg)
    c = target_config
    return LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                       num_hidden_layers=1, num_attention_heads=c.num_attention_heads,
                       num_key_value_heads=c.num_key_value_heads,
                       head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                       rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
                       tie_word_embeddings=False, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id,
                       pad_token_id=c.pad_token_id)


def is_eagle_draft(path: str | Path) -> bool:
    """True when `path` is an EAGLE-style draft folder (accel_draft.json method "eagle")."""
    meta = Path(path) / DRAFT_META_FILE
    return meta.exists() and json.loads(meta.read_text()).get("method") == EAGLE_METHOD


class EagleDraft(CausalLM):
    """The runtime's Llama stack with one layer, an input `fc` over [embedding ; feature] and a K-row head."""

    def __init__(self, config, num_head_rows: int) -> None:
        super().__init__(config)
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.tie_word_embeddings = False
        self.lm_head = nn.Linear(hidden, num_head_rows, bias=False)

    def forward(self, input_ids: Tensor, positions: Tensor, meta, kv_caches, features: Tensor | None = None
                ) -> Tensor:
        """input_ids, positions [T], features [T, H] (f_i of the token before each input) -> h [T, H] (normed)."""
        x, cos, sin = self._inputs(input_ids, positions, features)
        x = self.fc(x)
        residual = None
        for layer, cache in zip(self.model.layers, kv_caches):
            x, residual = layer(x, residual, cos, sin, cache, meta)
        return self.model.norm(x, residual)

    def forward_logits(self, input_ids: Tensor, positions: Tensor, meta, kv_caches, logit_rows: list[int],
                       features: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """-> (h [T, H], head logits of `logit_rows` [R, K] float32, their argmax or None). A step the native
        decode takes (the chain's one-row forwards, short catch-up spans) runs fc, the layer, norm and head in one
        call. Why: on a 2-core CPU the module path's per-op overhead outweighs streaming the weights (int8: 4 MB
        for the layer and 8,192 head rows), and a chain runs several forwards per target step."""
        native = getattr(self, "native_decode", None)
        if native is not None and native.has_head and native.takes(meta, input_ids.shape[0]):
            return native(*self._inputs(input_ids, positions, features), meta, kv_caches, logit_rows)
        hidden = self(input_ids, positions, meta, kv_caches, features=features)
        rows = torch.tensor(logit_rows, dtype=torch.long, device=hidden.device)
        return hidden, self.lm_head(hidden.index_select(0, rows)).float(), None

    def _inputs(self, input_ids: Tensor, positions: Tensor, features: Tensor | None
                ) -> tuple[Tensor, Tensor, Tensor]:
        """-> fc's input [embed ; feature] [T, 2H], RoPE cos and signed sin [T, 1, D]."""
        if features is None:
            raise ValueError("an EAGLE draft needs the target's features for every input token")
        emb, cos, sin = self._embed(input_ids, positions)
        return torch.cat([emb, features.to(emb.dtype)], dim=-1), cos, sin


def load_eagle_draft(path: str | Path, embedding: nn.Module, dtype: torch.dtype, device: torch.device
                     ) -> tuple[EagleDraft, list[int]]:
    """Load an EAGLE draft folder onto `device`, sharing the target's input embedding module (an INT8 table stays
    INT8: a draft of Gemma 3 would otherwise hold a 670 MB fp32 copy); returns (model, vocab_ids)."""
    from transformers import AutoConfig

    path = Path(path)
    if not is_eagle_draft(path):
        raise ValueError(f"{path} is not an EAGLE draft folder ({DRAFT_META_FILE} with method 'eagle' missing)")
    config = AutoConfig.from_pretrained(path)
    vocab_ids = [int(i) for i in json.loads((path / DRAFT_META_FILE).read_text())["vocab_ids"]]
    shape = (embedding.num_embeddings, embedding.embedding_dim)
    if shape != (config.vocab_size, config.hidden_size):
        raise ValueError(f"EAGLE draft {path} expects a target embedding of shape "
                         f"({config.vocab_size}, {config.hidden_size}); the target has {shape}")
    with torch.device("meta"):
        model = EagleDraft(config, len(vocab_ids))
        model.model.embed_tokens = nn.Module()  # the target's comes in below: no table of the draft's own
    model = model.to_empty(device=device).to(dtype)
    state = load_file(str(path / "model.safetensors"), device=str(device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    unexpected = [u for u in unexpected if "rotary_emb" not in u]
    if missing or unexpected:
        raise ValueError(f"EAGLE draft {path} does not match: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.init_rope(device, dtype)
    model = model.eval().requires_grad_(False)
    model.model.embed_tokens = embedding  # after requires_grad_: the target's module is the target's
    return model, vocab_ids


def save_eagle_draft(out_dir: str | Path, config, state: dict[str, Tensor], vocab_ids: list[int], meta: dict,
                     tokenizer_dir: str | Path | None = None) -> Path:
    """Write the folder described in the module docstring (state: fc.*, model.layers.0.*, model.norm.weight,
    lm_head.weight [K, H]). Written into a temporary sibling and renamed: an interrupted save leaves nothing."""
    import shutil


    out = Path(out_dir)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg = config.to_dict()
    cfg.update(num_hidden_layers=1, tie_word_embeddings=False, architectures=[EAGLE_ARCHITECTURE])
    cfg.pop("layer_types", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
    for name in TOKENIZER_FILES if tokenizer_dir is not None else ():
        src = Path(tokenizer_dir) / name
        if src.exists():
            shutil.copy2(src, tmp / name)
    (tmp / DRAFT_META_FILE).write_text(json.dumps({**meta, "method": EAGLE_METHOD, "vocab_ids": list(vocab_ids)}))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


class EagleProposer(PagedDraftProposer):
    """Batched EAGLE drafting over the draft's own 1-layer paged KV; see the module docstring.

    The draft's sequence for a request is the target's tokens shifted by one (y_i = x_{i+1}), so position i of
    the draft pairs y_i with f_i. `target_runner` is the engine's ModelRunner: this proposer gives it a feature
    cache (one row per KV slot) and reads the real features of verified positions from it by block table.

    `context_window`: a request's first draft catches up on only its last `context_window` positions, and the
    draft's sequence starts there (renumbered from 0: rotary attention depends only on relative positions, so
    this is the draft attending over a window that then grows). Why: the catch-up is a prefill of the whole
    context through the draft, paid once per request whenever it starts drafting; at batch 16 the first drafts
    in the batch's tail cost ~4% of the run (0.3 s of 7.3 s, measured) while the target's feature f_i already
    carries the long context. None: the whole context. Outputs stay exact either way (verification).
    """

    feeds_features = True

    def __init__(self, model: EagleDraft, vocab_ids: list[int], target_runner, num_blocks: int,
                 block_size: int = 16, context_window: int | None = DEFAULT_CONTEXT_WINDOW) -> None:
        super().__init__(model, num_blocks, block_size, vocab_ids=None)
        if context_window is not None and context_window < 1:
            raise ValueError(f"context_window={context_window} is invalid; allowed: None or >= 1")
        self.context_window = context_window
        self.base: dict[str, int] = {}  # request id -> index of the draft's first position in the shifted tokens
        self.vocab_ids = torch.tensor(vocab_ids, dtype=torch.long, device=self.runner.device)
        self.vocab_size = int(model.config.vocab_size)
        self.target_runner = target_runner
        self.block_size = block_size
        if getattr(target_runner, "feature_cache", None) is None:
            target_runner.enable_feature_cache()
        self.num_real: dict[str, int] = {}  # request id -> draft positions computed from real features

    @classmethod
    def from_target(cls, path: str | Path, target_model: CausalLM, target_runner, num_blocks: int,
                    block_size: int = 16, target_dir: str | Path | None = None, quant_scheme: str | None = None
                    ) -> EagleProposer:
        """Load the folder for this target (its tokenizer must match target_dir's when given).

        quant_scheme "int8": per-channel int8 weights for fc, the layer and the head rows. Why: at batch 1 a draft
        forward streams its weights, and the 8192-row head alone is more bytes (19 MB fp32) than the layer."""
        if target_dir is not None and (Path(target_dir) / "tokenizer.json").exists():
            check_tokenizers_match(target_dir, path)
        if quant_scheme not in (None, "int8"):
            raise ValueError(f"quant_scheme={quant_scheme!r} is invalid for an EAGLE draft; allowed: None, int8")
        p = next(target_model.parameters())
        model, vocab_ids = load_eagle_draft(path, target_model.model.embed_tokens, p.dtype, p.device)
        if quant_scheme is not None:
            from accel.speculative.paged_draft import quantize_draft

            quantize_draft(model, quant_scheme, head=True)
        fuse_projections(model)
        try:  # CPU fp32: the runtime's pre-packed Linears, and the native decode step over the layer and head
            from accel.kernels.linear import pack_float_linears
        except ImportError:
            pass
        else:
            pack_float_linears(model)
            if p.device.type == "cpu" and p.dtype == torch.float32:
                model.native_decode = NativeDecode.for_model(model, input_proj=model.fc)
        return cls(model, vocab_ids, target_runner, num_blocks, block_size)

    def finish(self, request_id: str) -> None:
        super().finish(request_id)
        self.num_real.pop(request_id, None)
        self.base.pop(request_id, None)

    def _prepare(self, r: ProposalRequest) -> Sequence | None:

        if r.block_table is None:
            raise ValueError(f"request {r.request_id!r}: an EAGLE draft needs the target's block table")
        full = r.token_ids[1:]  # y_i = x_{i+1}; the last one is the token just sampled
        seq = self.seqs.get(r.request_id)
        if seq is None:
            # the first draft catches up on the last `context_window` positions only (see the class docstring)
            self.base[r.request_id] = max(0, len(full) - self.context_window) if self.context_window else 0
        shifted = list(full[self.base[r.request_id]:])
        if not shifted or len(shifted) + r.k > self.max_positions:
            return None
        if seq is None:
            seq = self.seqs[r.request_id] = Sequence(r.request_id, shifted, _GREEDY)
        return self._rewind(seq, shifted, r.k, max_keep=self.num_real.get(r.request_id, 0))

    def _first_features(self, r: ProposalRequest, seq: Sequence) -> Tensor:
        """The target's real features for the positions `seq` catches up on; they count as real from now."""
        base = self.base[r.request_id]
        feats = self._real_features(r.block_table, base + seq.num_computed_tokens, base + seq.num_tokens)
        self.num_real[r.request_id] = seq.num_tokens
        return feats

    def _real_features(self, block_table: list[int], start: int, end: int) -> Tensor:
        """The target's features f_start .. f_{end-1} from its feature cache (rows by KV slot)."""
        bs = self.block_size
        cache = self.target_runner.feature_cache
        # slots as a Python list, one tensor made: these are 1-9 positions a step, where tensor arithmetic on the
        # whole block table costs more
        slots = [block_table[p // bs] * bs + p % bs for p in range(start, end)]
        return cache.index_select(0, torch.tensor(slots, dtype=torch.long, device=cache.device))

    def _forward(self, ids: Tensor, pos: Tensor, meta, picked: list[int], feats: list[Tensor]
                 ) -> tuple[Tensor, Tensor | None]:
        hidden, logits, _ = self.model.forward_logits(ids, pos, meta, self.runner.kv_caches, picked,
                                                       features=torch.cat(feats))  # [T, H], [B, K]
        return hidden[torch.tensor(picked, device=hidden.device)], logits

