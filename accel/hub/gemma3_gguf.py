"""A Gemma 3 GGUF file to a Hugging Face folder, as llama.cpp reads the file.

Why our own: transformers' GGUF loader (5.x) reads Gemma 3 into a silently wrong model: its tokenizer adds no
`<bos>` and splits "The capital of France is" into 10 pieces where llama.cpp makes 5, and greedy output
repeats " is". What llama.cpp does with the same file, and so what this does:

- weights: `convert_hf_to_gguf.py` stored every Gemma RMSNorm weight as `1 + w`; HF's Gemma3RMSNorm multiplies by
  `1 + w`, so 1 is taken off again. q/k are not permuted (Gemma's RoPE is the NeoX/rotate-half one). The head is
  the embedding table (tied).
- config: the GGUF holds one RoPE base and the window; llama.cpp's gemma3 arch fixes the rest (every 6th layer
  global, the sliding layers' RoPE base 10,000, queries scaled by head_dim^-1/2), as HF's Gemma3TextConfig does.
- tokenizer: a SentencePiece vocabulary with scores. llama.cpp's SPM tokenizer merges the adjacent pair whose
  joined text is the highest-scoring token; a BPE whose merge ranks follow those scores (every split of a token
  into two tokens is a merge) makes the same pieces. Spaces become "▁" (no prefix space), byte fallback, `<bos>`
  first. User-defined tokens (runs of newlines, tabs, HTML tags) are matched in raw text before the model, as
  llama.cpp's special-token partition does; control tokens are special.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SLIDING_WINDOW_PATTERN = 6  # llama.cpp's gemma3: layers 6, 12, ... (1-based) attend globally
LOCAL_ROPE_THETA = 10_000.0  # llama.cpp's gemma3: rope_freq_base_train_swa

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def hf_tensor_name(gguf_name: str) -> str:
    """GGUF tensor name -> HF Gemma3ForCausalLM parameter name."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    blk, i, part, suffix = gguf_name.split(".")
    if blk != "blk" or part not in _LAYER_NAMES:
        raise ValueError(f"unexpected tensor {gguf_name!r} in a gemma3 GGUF")
    return f"model.layers.{i}.{_LAYER_NAMES[part]}.{suffix}"


def to_hf(gguf_name: str, w):
    """A dequantized tensor as HF's Gemma3 holds it: norms back to `w` (the GGUF stores 1 + w)."""
    return w - 1.0 if gguf_name.endswith("norm.weight") else w


def check_supported(reader) -> None:
    """Refuse, before any work, a gemma3 GGUF this converter would read wrong, naming what differs."""
    model = _field(reader, "tokenizer.ggml.model")
    if model != "llama":
        raise ValueError(f"tokenizer.ggml.model={model!r}; supported: 'llama' (SentencePiece with scores)")
    if _field(reader, "tokenizer.ggml.add_space_prefix", True):
        raise ValueError("tokenizer.ggml.add_space_prefix=True; supported: False (Gemma 3's tokenizer)")
    a = "gemma3"
    if _field(reader, f"{a}.attention.value_length") != _field(reader, f"{a}.attention.key_length"):
        raise ValueError("attention.value_length != attention.key_length; supported: equal head sizes")
    if "output.weight" in {t.name for t in reader.tensors}:
        raise ValueError("an untied output.weight; supported: the head tied to token_embd (Gemma 3)")


def gemma3_config(reader):
    """The HF Gemma3TextConfig of a gemma3 GGUF's metadata."""
    from transformers import Gemma3TextConfig

    a = "gemma3"
    n_layers = int(_field(reader, f"{a}.block_count"))
    head_dim = int(_field(reader, f"{a}.attention.key_length"))
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    return Gemma3TextConfig(
        vocab_size=n_vocab,
        hidden_size=int(_field(reader, f"{a}.embedding_length")),
        intermediate_size=int(_field(reader, f"{a}.feed_forward_length")),
        num_hidden_layers=n_layers,
        num_attention_heads=int(_field(reader, f"{a}.attention.head_count")),
        num_key_value_heads=int(_field(reader, f"{a}.attention.head_count_kv")),
        head_dim=head_dim,
        query_pre_attn_scalar=head_dim,
        max_position_embeddings=int(_field(reader, f"{a}.context_length")),
        rms_norm_eps=float(str(np.float32(_field(reader, f"{a}.attention.layer_norm_rms_epsilon")))),  # 1e-06, not 9.99e-07
        sliding_window=int(_field(reader, f"{a}.attention.sliding_window")),
        layer_types=["sliding_attention" if (i + 1) % SLIDING_WINDOW_PATTERN else "full_attention"
                     for i in range(n_layers)],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": float(_field(reader, f"{a}.rope.freq_base"))},
            "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_ROPE_THETA},
        },
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        pad_token_id=int(_field(reader, "tokenizer.ggml.padding_token_id", 0)),
        tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh",
        architectures=["Gemma3ForCausalLM"],
        dtype="float32",
    )


def spm_merges(pieces: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece/llama.cpp score-ordered merging: every split of a mergeable piece
    into two pieces of the vocabulary, ranked by the joined piece's score (highest first), ties by its id."""
    vocab = {p: i for i, p in enumerate(pieces) if types[i] != BYTE}
    ranked = []
    for i, p in enumerate(pieces):
        if types[i] == BYTE or len(p) < 2:
            continue
        for k in range(1, len(p)):
            if p[:k] in vocab and p[k:] in vocab:
                ranked.append((-scores[i], i, vocab[p[:k]], vocab[p[k:]], p[:k], p[k:]))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def gemma3_tokenizer(reader):
    """The HF tokenizer that splits text as llama.cpp does with this GGUF's vocabulary (see the module doc)."""
    from tokenizers import AddedToken
    from transformers import GemmaTokenizer

    f = reader.fields
    pieces = [str(f["tokenizer.ggml.tokens"].contents(i)) for i in range(len(f["tokenizer.ggml.tokens"].data))]
    scores = [float(x) for x in f["tokenizer.ggml.scores"].contents()]
    types = [int(x) for x in f["tokenizer.ggml.token_type"].contents()]

    def piece(key: str) -> str:
        return pieces[int(_field(reader, key))]

    tok = GemmaTokenizer(
        vocab={p: i for i, p in enumerate(pieces)}, merges=spm_merges(pieces, scores, types),
        unk_token=piece("tokenizer.ggml.unknown_token_id"), bos_token=piece("tokenizer.ggml.bos_token_id"),
        eos_token=piece("tokenizer.ggml.eos_token_id"), pad_token=piece("tokenizer.ggml.padding_token_id"),
        mask_token="<mask>" if "<mask>" in pieces else None,
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", True)),
        add_eos_token=bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
    )
    tok.add_tokens([AddedToken(p, special=types[i] == CONTROL, normalized=False)
                    for i, p in enumerate(pieces) if types[i] in (CONTROL, USER_DEFINED)])
    tok.clean_up_tokenization_spaces = False
    return tok
