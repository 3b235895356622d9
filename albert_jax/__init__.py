"""albert_jax: ALBERT and the BERT family in JAX/Flax, from pre-training to fine-tuning."""

from albert_jax.model_config import ModelConfig
from albert_jax.models import Albert

__version__ = "0.1.0"

__all__ = ["Albert", "ModelConfig", "__version__"]


def __getattr__(name):
  # Loading pulls in ml-collections and safetensors; importing the model
  # alone (as kernels and the GPU machine do) should not.
  if name in ("load_pretrained", "Pretrained"):
    from albert_jax import pretrained  # pylint: disable=g-import-not-at-top
    return getattr(pretrained, name)
  raise AttributeError(f"module 'albert_jax' has no attribute {name!r}")
