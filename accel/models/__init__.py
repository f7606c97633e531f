"""Model zoo and loading: registry of known models, GGUF -> safetensors conversion, cache dir."""

from accel.models.registry import REGISTRY, ModelSpec, get_spec
from accel.models.zoo import (
    ModelInfo,
    ModelNotFoundError,
    accel_home,
    convert_gguf,
    list_models,
    models_dir,
    pull,
    resolve_model,
)

__all__ = [
    "REGISTRY", "ModelSpec", "get_spec", "ModelInfo", "ModelNotFoundError", "accel_home", "convert_gguf",
    "list_models", "models_dir", "pull", "resolve_model",
]
