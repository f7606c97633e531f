"""The Gemma 3 GGUF conversion, pinned on a tiny synthetic GGUF written here with the `gguf` package the way
llama.cpp's convert_hf_to_gguf.py writes one (norms stored as 1 + w, SPM vocabulary with scores): the folder it
makes is the model that was written (weights, config, logits in transformers), and its tokenizer splits text as
llama.cpp's SPM tokenizer does (a reference implementation of that algorithm is below)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from accel.hub import gemma3_gguf
from accel.hub.zoo import convert_gguf
from tests.hub.gguf_writing import add_tensor, decoder_writer, finish

NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
USER = ["\n", "\n\n", "  "]
CHARS = list("▁abdehlortw")
MERGED = ["▁t", "he", "▁the", "ll", "llo", "▁w", "or", "ld", "▁wor", "▁world", "▁he", "▁hello", "lo", "el", "wo",
          "▁a", "ab", "▁ab", "ba", "aba", "▁abab"]


def tiny_vocab(seed: int = 0) -> tuple[list[str], list[float], list[int]]:
    rng = random.Random(seed)
    pieces = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + USER + CHARS + MERGED
    types = [CONTROL] * 5 + [BYTE] * 256 + [USER_DEFINED] * len(USER) + [NORMAL] * (len(CHARS) + len(MERGED))
    scores = [-1000.0] * 5 + [0.0] * 256 + [-1000.0] * len(USER) + [-float(rng.randrange(1, 60))
                                                                     for _ in CHARS + MERGED]
    return pieces, scores, types


def spm_reference(text: str, pieces: list[str], scores: list[float], types: list[int]) -> list[int]:
    """llama.cpp's SPM tokenizer (llm_tokenizer_spm), written out plainly: user-defined tokens split the raw text
    first (leftmost, longest); each other fragment has its spaces escaped, starts as characters, and repeatedly merges
    the adjacent pair whose joined text is the highest-scoring token (leftmost on ties); what is left and is no token
    becomes byte tokens. BOS first."""
    ids = {p: i for i, p in enumerate(pieces)}
    user = sorted((p for p, t in zip(pieces, types) if t == USER_DEFINED), key=len, reverse=True)
    out, frag, i = [2], "", 0

    def flush(s: str) -> None:
        syms = list(s.replace(" ", "▁"))
        while True:
            best = None
            for j in range(len(syms) - 1):
                joined = syms[j] + syms[j + 1]
                if joined in ids and (best is None or scores[ids[joined]] > scores[ids[best[1]]]):
                    best = (j, joined)
            if best is None:
                break
            syms[best[0]:best[0] + 2] = [best[1]]
        for sym in syms:
            out.extend([ids[sym]] if sym in ids else [ids[f"<0x{b:02X}>"] for b in sym.encode()])

    while i < len(text):
        hit = next((u for u in user if text.startswith(u, i)), None)
        if hit is None:
            frag += text[i]
            i += 1
            continue
        flush(frag)
        frag = ""
        out.append(ids[hit])
        i += len(hit)
    flush(frag)
    return out


def write_gguf(path, hf_model, pieces, scores, types, quantized: str | None = None) -> None:
    c = hf_model.config
    w = decoder_writer(path, "gemma3", c, c.rope_parameters["full_attention"]["rope_theta"])
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_sliding_window(c.sliding_window)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    names = {v: k for k, v in gemma3_gguf._LAYER_NAMES.items()}
    for name, t in hf_model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        else:
            _, _, i, *mod, suffix = name.split(".")
            g = f"blk.{i}.{names['.'.join(mod)]}.{suffix}"
        a = t.float().numpy() + (1.0 if g.endswith("norm.weight") else 0.0)
        add_tensor(w, g, a, g == quantized)
    finish(w)


def tiny_gemma3(vocab_size: int):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=7, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, max_position_embeddings=256,
        sliding_window=8, rms_norm_eps=1e-6, layer_types=None,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        bos_token_id=2, eos_token_id=1, pad_token_id=0, tie_word_embeddings=True, initializer_range=0.2)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # Gemma's norms start at w = 0 (scale 1): make the offset matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    pieces, scores, types = tiny_vocab()
    hf = tiny_gemma3(len(pieces))
    tmp = tmp_path_factory.mktemp("gemma3")
    write_gguf(tmp / "tiny.gguf", hf, pieces, scores, types, quantized="blk.1.ffn_up.weight")
    out = convert_gguf(tmp / "tiny.gguf", tmp / "folder", name="tiny-gemma3", source="test")
    return hf, out, (pieces, scores, types), tmp / "tiny.gguf"


def test_the_folder_is_the_model_that_was_written(converted):
    import gguf
    from transformers import AutoConfig, AutoModelForCausalLM

    hf, folder, _, path = converted
    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == "gemma3_text" and config.sliding_window == 8
    # llama.cpp's gemma3: every 6th layer global, the sliding layers' RoPE base 10,000
    assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert config.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert config.rms_norm_eps == 1e-6 and config.tie_word_embeddings
    ours = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    want = hf.state_dict()
    reader = gguf.GGUFReader(str(path))
    q8 = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")
    want["model.layers.1.mlp.up_proj.weight"] = torch.from_numpy(
        gguf.quants.dequantize(q8.data, q8.tensor_type).reshape(96, 64).copy())
    got = ours.state_dict()
    assert set(got) == set(want)
    for name in want:  # norms round-trip through 1 + w exactly enough for fp32
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=0, msg=name)
    ids = torch.randint(5, len(converted[2][0]), (1, 40), generator=torch.Generator().manual_seed(1))
    hf.model.layers[1].mlp.up_proj.weight.data.copy_(want["model.layers.1.mlp.up_proj.weight"])
    with torch.no_grad():  # 40 tokens: past the 8-token window of the sliding layers
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)


def test_the_tokenizer_splits_as_llama_cpp_spm(converted):
    from transformers import AutoTokenizer

    _, folder, (pieces, scores, types), _ = converted
    tok = AutoTokenizer.from_pretrained(folder)
    rng = random.Random(3)
    alphabet = ["a", "b", "d", "e", "h", "l", "o", "r", "t", "w", " ", " ", "\n", "é", "the", "hello", "world"]
    texts = ["hello world", "the  world\n\nabab", "  leading spaces", "Ωmega é\n", ""]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30))) for _ in range(300)]
    for text in texts:
        assert tok(text)["input_ids"] == spm_reference(text, pieces, scores, types), repr(text)
    assert tok.decode(tok("the  world\n\nΩ")["input_ids"], skip_special_tokens=True) == "the  world\n\nΩ"
    assert tok.bos_token_id == 2 and tok.eos_token_id == 1 and tok.pad_token_id == 0


def test_spm_merges_rank_by_the_joined_pieces_score():
    pieces = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [-1.0, -1.0, -1.0, -5.0, -2.0, -3.0]
    merges = gemma3_gguf.spm_merges(pieces, scores, [NORMAL] * 6)
    assert merges == [("b", "c"), ("a", "bc"), ("ab", "c"), ("a", "b")]


def test_an_unsupported_gguf_is_refused_naming_what(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "gemma3")
    w.add_tokenizer_model("gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    reader = gguf.GGUFReader(str(tmp_path / "x.gguf"))
    with pytest.raises(ValueError, match="tokenizer.ggml.model='gpt2'; supported: 'llama'"):
        gemma3_gguf.check_supported(reader)
    with pytest.raises(ValueError, match="unexpected tensor 'blk.0.attn_qkv.weight'"):
        gemma3_gguf.hf_tensor_name("blk.0.attn_qkv.weight")
