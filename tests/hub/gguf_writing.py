"""Writing tiny GGUF files in tests, as llama.cpp's convert_hf_to_gguf.py writes them: the header every decoder
family shares, and the tensors (Q8_0 where a row is whole blocks of 32, else F32)."""

from __future__ import annotations

import numpy as np


def decoder_writer(path, arch: str, config, rope_theta: float):
    """A GGUFWriter with the decoder's shape fields set."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_freq_base(rope_theta)
    return w


def add_tensor(w, name: str, a: np.ndarray, quantize: bool) -> None:
    import gguf

    if quantize:
        w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        w.add_tensor(name, a.astype(np.float32))


def finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
