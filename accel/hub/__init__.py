"""Model zoo and loading: registry of known models, GGUF -> safetensors conversion, cache dir."""

from accel.hub.registry import REGISTRY, ModelSpec, get_spec
from accel.hub.zoo import (
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
