"""A GGUF file into a Hugging Face folder (config, fp32 safetensors, tokenizer, chat template), one tensor at a time.

Each tensor is dequantized, renamed and written before the next is read (`accel.tensorio.write_folder`), so the
conversion holds one tensor (the largest is the token table: 0.9 GB for Qwen2.5's 151,936 x 1,536) beside the
mapped GGUF, not the fp32 model twice as `from_pretrained(gguf_file=...)` + `save_pretrained` did.

Families: Gemma 3 through accel's own reader (`gemma3_gguf`: transformers' reads it wrong); the others through
transformers' GGUF metadata readers (config, tokenizer with the file's chat template) and its per-architecture
tensor map and processors (Llama's q/k permutation undone), applied tensor by tensor.
"""

from __future__ import annotations

import gc
import mmap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from accel.progress import SILENT, Reporter
from accel.tensorio import TensorSpec, write_folder

_DEQUANT_ROWS_BYTES = 4 << 20  # quantized bytes dequantized per numpy call: bounds its float64 temporaries


@dataclass
class Entry:
    """One output tensor: its HF name, fp32 shape, and how to make it."""

    name: str
    shape: tuple[int, ...]
    make: Callable[[], torch.Tensor]
    source: str  # the GGUF tensor it is made from


def dequantize(t) -> torch.Tensor:
    """A GGUF tensor (`gguf.ReaderTensor`) as an fp32 torch tensor in HF order ([rows, row length]), dequantized a
    block of rows at a time so numpy's temporaries stay small."""
    from gguf.quants import dequantize as gguf_dequantize

    shape = [int(n) for n in reversed(t.shape)]  # GGUF lists ne0 (the row length) first
    out = torch.empty(shape, dtype=torch.float32)
    data = t.data
    if data.ndim < 2 or len(shape) < 2:
        out.numpy()[...] = np.asarray(gguf_dequantize(data, t.tensor_type)).reshape(shape)
        return out
    flat = out.view(-1, shape[-1])
    rows_data = data.reshape(flat.shape[0], -1)
    step = max(1, _DEQUANT_ROWS_BYTES // max(1, rows_data.shape[1] * rows_data.itemsize))
    for r in range(0, flat.shape[0], step):
        part = gguf_dequantize(rows_data[r:r + step], t.tensor_type)
        flat[r:r + step].numpy()[...] = np.asarray(part).reshape(-1, shape[-1])
    return out


def _transformers_family(reader, gguf_path: Path, name: str):
    """(config, tokenizer, entries) of a GGUF that transformers' GGUF readers understand."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                          get_gguf_hf_weights_map)

    folder, fname = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=fname)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    config.architectures = [type(model).__name__]
    arch = str(reader.fields["general.architecture"].contents())
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    name_map = get_gguf_hf_weights_map(model, processor)
    expected = {k for k in model.state_dict() if not (config.tie_word_embeddings and k == "lm_head.weight")}
    entries = []
    for t in reader.tensors:
        if t.name not in name_map:  # tensors transformers does not load either (e.g. rope_freqs)
            continue
        hf = name_map[t.name]

        def make(t=t):
            w = processor.process(weights=dequantize(t).numpy(), name=t.name, tensor_key_mapping=name_map,
                                  parsed_parameters={}).weights
            return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))  # no copy unless permuted

        entries.append(Entry(hf, tuple(int(n) for n in reversed(t.shape)), make, t.name))
    missing = expected - {e.name for e in entries}
    if missing:
        raise ValueError(f"{gguf_path.name}: no tensors for {sorted(missing)[:5]} ({len(missing)} in all)")
    _fix_special_tokens(tokenizer, config)
    return config, tokenizer, entries


def _fix_special_tokens(tokenizer, config) -> None:
    """Make the tokenizer's eos/pad agree with the model's config.

    transformers' GGUF tokenizer conversion (5.x) sets eos_token to the BOS token for SmolLM2 (`<|im_start|>`), while
    the GGUF metadata (kept in config/generation_config) says eos is `<|im_end|>`; every consumer that asks the
    tokenizer for eos would otherwise stop on the wrong token. BPE tokenizers must not "clean up" spaces either.
    """
    eos = getattr(config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if eos is not None and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    if tokenizer.pad_token_id is None and getattr(config, "pad_token_id", None) is not None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(config.pad_token_id)
    tokenizer.clean_up_tokenization_spaces = False


def _gemma3_family(reader, gguf_path: Path, name: str):
    from accel.hub import gemma3_gguf

    gemma3_gguf.check_supported(reader)
    entries = [Entry(gemma3_gguf.hf_tensor_name(t.name), tuple(int(n) for n in reversed(t.shape)),
                     lambda t=t: gemma3_gguf.to_hf(t.name, dequantize(t)), t.name) for t in reader.tensors]
    return gemma3_gguf.gemma3_config(reader), gemma3_gguf.gemma3_tokenizer(reader), entries


def _release(reader, t) -> None:
    """Drop tensor `t`'s pages of the mapped GGUF once read: mapped pages count in the process's RSS until unmapped,
    so a whole read file would otherwise sit beside the tensors made from it."""
    page = mmap.PAGESIZE
    start = -(-int(t.data_offset) // page) * page
    end = (int(t.data_offset) + int(t.n_bytes)) // page * page
    if end > start:
        reader.data._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)


def convert(gguf_path: Path, out_dir: Path, name: str, reporter: Reporter = SILENT) -> None:
    """Write `out_dir` (config.json, generation_config.json, fp32 safetensors, tokenizer files) from a GGUF."""
    from gguf import GGUFReader
    from transformers import GenerationConfig

    reader = GGUFReader(str(gguf_path))
    arch = str(reader.fields["general.architecture"].contents())
    config, tokenizer, entries = (_gemma3_family if arch == "gemma3" else _transformers_family)(reader, gguf_path,
                                                                                                 name)
    config._name_or_path = name
    config.dtype = "float32"
    config.save_pretrained(out_dir)
    GenerationConfig.from_model_config(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    del tokenizer  # its Python-side vocabulary and merges are large: gone before the tensors come
    gc.collect()
    specs = [TensorSpec(e.name, torch.float32, e.shape) for e in entries]
    total = sum(s.nbytes for s in specs)

    def tensors() -> Iterator[torch.Tensor]:
        for e, t in zip(entries, [t for t in reader.tensors if t.name in {e.source for e in entries}]):
            yield e.make()
            _release(reader, t)

    with reporter.task(f"converting {gguf_path.name}", total, unit="B") as advance:
        write_folder(Path(out_dir), specs, tensors(), progress=advance)
