"""Building blocks shared by every model in the family.

Each parameter is created with logical axis names (`embed`, `heads`, `kv`,
`mlp`, `vocab`, ...) so that the trainer can map them onto any device mesh
from configuration alone. Parameters are stored in `param_dtype` and cast to
the compute `dtype` at use.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any


def kernel_init(stddev: float) -> Callable:
  """Truncated normal at ±2σ, as the official ALBERT/BERT code initialises."""
  return nn.initializers.truncated_normal(stddev=stddev)


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """Maps a config's `hidden_act` to a function.

  `gelu` is the exact erf form and `gelu_new` the tanh approximation, following
  HF's names (the official TF code's "gelu" is the tanh form, i.e. gelu_new).
  """
  table = {
      "gelu": lambda x: jax.nn.gelu(x, approximate=False),
      "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
      "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
      "relu": jax.nn.relu,
      "tanh": jnp.tanh,
  }
  if name not in table:
    raise ValueError(
        f"Unknown activation {name!r}; choose one of {sorted(table)}.")
  return table[name]


class Dense(nn.Module):
  """y = x·W + b over the last `len(in_axes)` axes of x.

  Attributes:
    features: output feature shape, e.g. (heads, head_dim) or (hidden,).
    axes: logical names of the kernel, input axes first then output axes.
    contract: number of trailing input axes contracted.
  """
  features: Sequence[int]
  axes: Sequence[str | None]
  contract: int = 1
  use_bias: bool = True
  init_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features = tuple(self.features)
    in_shape = x.shape[-self.contract:]
    kernel = self.param(
        "kernel",
        nn.with_logical_partitioning(kernel_init(self.init_range),
                                     tuple(self.axes)),
        in_shape + features, self.param_dtype)
    in_letters = "abcd"[:self.contract]
    out_letters = "wxyz"[:len(features)]
    y = jnp.einsum(f"...{in_letters},{in_letters}{out_letters}->...{out_letters}",
                   x.astype(self.dtype), kernel.astype(self.dtype))
    if self.use_bias:
      bias = self.param(
          "bias",
          nn.with_logical_partitioning(nn.initializers.zeros,
                                       tuple(self.axes[self.contract:])),
          features, self.param_dtype)
      y = y + bias.astype(self.dtype)
    return y


class LayerNorm(nn.Module):
  """LayerNorm computed in float32 whatever the compute dtype.

  The official eps is 1e-12, which underflows in bfloat16; normalising in
  float32 keeps it meaningful.
  """
  eps: float = 1e-12
  axis_name: str = "embed"
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features = x.shape[-1]
    scale = self.param(
        "scale", nn.with_logical_partitioning(nn.initializers.ones,
                                              (self.axis_name,)),
        (features,), self.param_dtype)
    bias = self.param(
        "bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                             (self.axis_name,)),
        (features,), self.param_dtype)
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
    y = y * scale.astype(jnp.float32) + bias.astype(jnp.float32)
    return y.astype(self.dtype)


class Embed(nn.Module):
  """A lookup table [num, features] that can also be read as a matrix."""
  num_embeddings: int
  features: int
  axes: tuple[str, str] = ("vocab", "embed")
  init_range: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def setup(self):
    self.embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(kernel_init(self.init_range), self.axes),
        (self.num_embeddings, self.features), self.param_dtype)

  def __call__(self, ids: jax.Array) -> jax.Array:
    """[...] int -> [..., features]."""
    return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

  def attend(self, x: jax.Array) -> jax.Array:
    """[..., features] -> [..., num_embeddings]: x · tableᵀ (tied decoder)."""
    return jnp.einsum("...e,ve->...v", x.astype(self.dtype),
                      self.embedding.astype(self.dtype))
