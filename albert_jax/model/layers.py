"""Building blocks shared by every model in the family.

Each parameter is created with logical axis names (`embed`, `heads`, `kv`,
`mlp`, `vocab`, ...) so that the trainer can map them onto any device mesh
from configuration alone. Parameters are stored in `param_dtype` and cast to
the compute `dtype` at use.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.ops import attention as attention_ops

Dtype = Any
# Python floats, so that they take the dtype of the array they multiply.
_HALF_SQRT_2_OVER_PI = 0.5 * math.sqrt(2.0 / math.pi)
_SQRT_HALF_OVER_PI = math.sqrt(0.5 / math.pi)  # φ(0) = 1/√(2π)


# How weight matrices and embedding tables start (`ModelConfig.initializer`).
INITIALIZERS = ("truncated_normal", "normal")


def kernel_init(stddev: float, kind: str = "truncated_normal") -> Callable:
  """A weight initialiser of scale `stddev`.

  "truncated_normal" is the official ALBERT/BERT code's
  (`tf.truncated_normal_initializer`): N(0, stddev²) redrawn outside ±2
  stddev, so the values' deviation is 0.88 stddev. "normal" is HF
  transformers' (`normal_(std=stddev)`), untruncated, deviation stddev.
  """
  if kind == "truncated_normal":
    return nn.initializers.truncated_normal(stddev=stddev)
  if kind == "normal":
    return nn.initializers.normal(stddev=stddev)
  raise ValueError(f"Unknown initializer {kind!r}; choose one of "
                   f"{INITIALIZERS}.")


@jax.custom_jvp
def gelu_tanh(x: jax.Array) -> jax.Array:
  """tanh-approximate GELU ("gelu_new"), with a one-array derivative.

  The values are `jax.nn.gelu(x, approximate=True)`'s, bit for bit. Autodiff
  of that formula would keep x³, tanh(·) and several products of them for the
  backward pass, and inside the layer scan each becomes a stacked
  [layers, batch, seq, mlp] residual; this rule keeps only gelu'(x).
  """
  return _gelu_tanh_and_slope(x)[0]


def _gelu_tanh_and_slope(x):
  """(gelu(x), gelu'(x)) of the tanh form, both in x's dtype."""
  c = np.sqrt(2 / np.pi).astype(x.dtype)
  th = jnp.tanh(c * (x + 0.044715 * (x ** 3)))
  y = x * (0.5 * (1.0 + th))
  # Past |x| = 10 the logistics' product below is under 1e-37, so the term
  # it scales is nothing beside the slope (0 or 1 there); clipping its
  # polynomial factor keeps x² from overflowing (to 0·inf = NaN) without
  # changing any value.
  xc = jnp.clip(x, -10.0, 10.0)
  # With u the tanh's argument, 0.5(1 + tanh u) = σ(2u) and (1 - tanh u)
  # (1 + tanh u) = 4 σ(2u) σ(-2u): the slope from logistic functions, not
  # from `th`. Sharing `th` with y made XLA:GPU write it to memory as an
  # array of its own between the backward pass's two kernels (ALBERT-large
  # at seq 512, batch 32 on an H100: 29.0 → 19.4 GB of the activation's
  # traffic a step). It is also exact where 1 ± tanh cancels in float32
  # (|x| ≈ 5): within 1.5e-7 of float64 everywhere, where the tanh form
  # was off by up to 3.5e-6.
  u2 = 2 * c * (x + 0.044715 * (x ** 3))
  s_pos, s_neg = jax.nn.sigmoid(u2), jax.nn.sigmoid(-u2)
  slope = s_pos + (4 * _HALF_SQRT_2_OVER_PI) * xc * (s_pos * s_neg) * (
      1.0 + (3 * 0.044715) * (xc * xc))
  return y, slope


@gelu_tanh.defjvp
def _gelu_tanh_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  y, slope = _gelu_tanh_and_slope(x)
  return y, slope * t


@jax.custom_jvp
def gelu_erf(x: jax.Array) -> jax.Array:
  """Exact (erf) GELU ("gelu"), with a one-array derivative.

  The values are `jax.nn.gelu(x, approximate=False)`'s, bit for bit; the
  derivative Φ(x) + x·φ(x) is the one array the backward pass keeps, where
  autodiff of erfc would keep x, erfc(·) and exp(-x²/2).
  """
  return _gelu_erf_and_slope(x)[0]


def _gelu_erf_and_slope(x):
  """(gelu(x), gelu'(x)) of the erf form, both in x's dtype."""
  erfc = jax.lax.erfc(-x * np.sqrt(0.5).astype(x.dtype))
  # exp(-x²/2) → 0 (x² may overflow to inf, exp(-inf) = 0): no NaN.
  pdf = _SQRT_HALF_OVER_PI * jnp.exp(-0.5 * (x * x))
  return 0.5 * x * erfc, 0.5 * erfc + x * pdf


@gelu_erf.defjvp
def _gelu_erf_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  y, slope = _gelu_erf_and_slope(x)
  return y, slope * t


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """Maps a config's `hidden_act` to a function.

  `gelu` is the exact erf form and `gelu_new` the tanh approximation, following
  HF's names (the official TF code's "gelu" is the tanh form, i.e. gelu_new).
  Both GELUs carry a custom derivative that the backward pass keeps as one
  array (`gelu_tanh`, `gelu_erf`).
  """
  table = {
      "gelu": gelu_erf,
      "gelu_new": gelu_tanh,
      "gelu_pytorch_tanh": gelu_tanh,
      "relu": jax.nn.relu,
      "tanh": jnp.tanh,
  }
  if name not in table:
    raise ValueError(
        f"Unknown activation {name!r}; choose one of {sorted(table)}.")
  return table[name]


def compile_platform() -> str:
  """"cpu", "gpu" or "tpu": the platform the computation being traced will
  be compiled for (`attention.target_platform`: the mesh's devices' under
  `jax.set_mesh`, else the default backend's). What changes with it is only
  how XLA runs an op, never its values."""
  return attention_ops.target_platform()


def _as_matrices(x, kernel, contract):
  """x [..., *in], kernel [*in, *out] → x [M, K], kernel [K, N] (bitcasts)."""
  depth = math.prod(kernel.shape[:contract])
  return (x.reshape(math.prod(x.shape[:x.ndim - contract]), depth),
          kernel.reshape(depth, -1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _cpu_matmul(x: jax.Array, kernel: jax.Array, contract: int,
                precision) -> jax.Array:
  """x [..., *in] · kernel [*in, *out] → [..., *out], for XLA:CPU.

  Computed as one [M, K] · [K, N] matmul. Autodiff would form the kernel's
  gradient as dot_general(x, g) contracting both operands' M axis, which
  XLA:CPU keeps as is and runs on its generic (Eigen) dot at about half the
  speed of YNNPACK, which takes only a row-major left operand contracted on
  its last axis. A materialised xᵀ [K, M], fenced by an optimisation barrier
  so that XLA cannot fold the transpose back into the dot, makes it the
  canonical [K, M] · [M, N] matmul. The copy is M·K values; on GPU and TPU
  it would be pure overhead, hence CPU only. The residuals are x and kernel
  themselves, not reshaped copies, so that Q, K and V share theirs and a
  scanned kernel is not stacked again.
  """
  x2, k2 = _as_matrices(x, kernel, contract)
  y = jnp.dot(x2, k2, precision=precision)
  return y.reshape(x.shape[:x.ndim - contract] + kernel.shape[contract:])


def _cpu_matmul_fwd(x, kernel, contract, precision):
  return _cpu_matmul(x, kernel, contract, precision), (x, kernel)


def _cpu_matmul_bwd(contract, precision, residuals, g):
  x, kernel = residuals
  x2, k2 = _as_matrices(x, kernel, contract)
  g2 = g.reshape(x2.shape[0], k2.shape[1])
  xt = jax.lax.optimization_barrier(x2.T)
  dx = jnp.dot(g2, k2.T, precision=precision).reshape(x.shape)
  dk = jnp.dot(xt, g2, precision=precision).reshape(kernel.shape)
  return dx, dk


_cpu_matmul.defvjp(_cpu_matmul_fwd, _cpu_matmul_bwd)


class Dense(nn.Module):
  """y = x·W + b over the last `len(in_axes)` axes of x.

  On CPU the matmul runs as [M, K] · [K, N] on the flattened input with the
  weight gradient formed as xᵀ·g (`_cpu_matmul`), which puts the weight
  gradients on XLA:CPU's fast matmul (ALBERT-base's train step: about 10%
  faster; BENCHMARKS.md). Same parameters, same values to float32 rounding.
  Elsewhere it is a plain einsum.

  Attributes:
    features: output feature shape, e.g. (heads, head_dim) or (hidden,).
    axes: logical names of the kernel, input axes first then output axes.
    contract: number of trailing input axes contracted.
    init_range, initializer: the kernel's initialiser (`kernel_init`; a field
      named `init` would hide flax's Module.init).
  """
  features: Sequence[int]
  axes: Sequence[str | None]
  contract: int = 1
  use_bias: bool = True
  init_range: float = 0.02
  initializer: str = "truncated_normal"
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, add_bias: bool = True):
    """[..., *in_shape] → [..., *features].

    With `add_bias=False` (and `use_bias`), returns (x·W, bias in the
    compute dtype) for the caller to add where it fuses better: the same
    parameters, the same values once added.
    """
    features = tuple(self.features)
    in_shape = x.shape[-self.contract:]
    kernel = self.param(
        "kernel",
        nn.with_logical_partitioning(
            kernel_init(self.init_range, self.initializer),
            tuple(self.axes)),
        in_shape + features, self.param_dtype)
    x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
    if compile_platform() == "cpu" and x.size and kernel.size:
      # Resolved now, so that the backward pass's dots (traced later, maybe
      # outside a `jax.default_matmul_precision` scope) use the same
      # precision as the forward's, as autodiff of the einsum would.
      precision = jax.config.jax_default_matmul_precision
      y = _cpu_matmul(x, kernel, self.contract, precision)
    else:
      in_letters = "abcd"[:self.contract]
      out_letters = "wxyz"[:len(features)]
      y = jnp.einsum(
          f"...{in_letters},{in_letters}{out_letters}->...{out_letters}",
          x, kernel)
    if self.use_bias:
      bias = self.param(
          "bias",
          nn.with_logical_partitioning(nn.initializers.zeros,
                                       tuple(self.axes[self.contract:])),
          features, self.param_dtype)
      if not add_bias:
        return y, bias.astype(self.dtype)
      y = y + bias.astype(self.dtype)
    return y


def _layer_norm_stats(x32, eps):
  """[..., 1] mean and reciprocal deviation of float32 x over its last
  axis."""
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
  return mean, jax.lax.rsqrt(var + eps)


def _layer_norm_grads(g, normed, rstd, scale, one_pass: bool = False):
  """LayerNorm's backward in float32: (dx, dscale, dbias) from the output's
  gradient g, the normalised input and the reciprocal deviation.
  `one_pass`: both parameter gradients as one variadic reduce (one pass
  over g and the normalised x instead of two: XLA:GPU then reads them
  once; the TPU compiler does better with the two sums)."""
  axes = tuple(range(g.ndim - 1))
  d_normed = g * scale
  dx = rstd * (d_normed - jnp.mean(d_normed, axis=-1, keepdims=True)
               - normed * jnp.mean(d_normed * normed, axis=-1, keepdims=True))
  if one_pass:
    dscale, dbias = jax.lax.reduce(
        (g * normed, g), (np.float32(0), np.float32(0)),
        lambda a, b: (a[0] + b[0], a[1] + b[1]), axes)
    return dx, dscale, dbias
  return dx, jnp.sum(g * normed, axis=axes), jnp.sum(g, axis=axes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array,
                eps: float) -> jax.Array:
  """(x - mean) / √(var + eps) · scale + bias over the last axis.

  All in float32 (x, scale and bias included: the casts outside carry the
  gradients back to other dtypes).

  Autodiff of this formula keeps three [..., features] arrays for the
  backward pass (x - mean, 2·(x - mean) from the square, and the normalised
  x), each a stacked [layers, B, T, H] residual inside the layer scan; this
  rule keeps the normalised x and the [..., 1] reciprocal deviation.
  """
  return _layer_norm_fwd(x, scale, bias, eps)[0]


def _layer_norm_fwd(x, scale, bias, eps):
  mean, rstd = _layer_norm_stats(x, eps)
  normed = (x - mean) * rstd
  return normed * scale + bias, (normed, rstd, scale)


def _layer_norm_bwd(eps, residuals, g):
  del eps
  normed, rstd, scale = residuals
  return _layer_norm_grads(g, normed, rstd, scale)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm_gpu(x: jax.Array, scale: jax.Array, bias: jax.Array,
                    eps: float, dtype) -> jax.Array:
  """`_layer_norm` for XLA:GPU: any input dtype in, `dtype` out.

  The casts to and from float32 are inside the rule, so that the backward
  pass writes the input's gradient once, in the input's dtype; the
  residuals are x itself in its own dtype (bfloat16 in a bfloat16 model:
  half the bytes of a float32 normalised x) and the [..., 1] mean and
  reciprocal deviation, read from memory (an optimisation barrier: else
  XLA recomputes the statistics inside every backward kernel that needs
  them, a row reduction that keeps the parameter gradients' column
  reduction out of those kernels). On an H100, ALBERT-large at seq 512,
  batch 32: LayerNorm's HBM traffic 30.7 → 20.4 GB a step. On one v5e chip
  the same rule costs 7.6 GB a step more than `_layer_norm`, so TPUs (and
  CPUs) keep that one.
  """
  return _layer_norm_gpu_fwd(x, scale, bias, eps, dtype)[0]


def _layer_norm_gpu_fwd(x, scale, bias, eps, dtype):
  f32 = jnp.float32
  x32 = x.astype(f32)
  mean, rstd = _layer_norm_stats(x32, eps)
  y = (x32 - mean) * rstd * scale.astype(f32) + bias.astype(f32)
  x, mean, rstd = jax.lax.optimization_barrier((x, mean, rstd))
  return y.astype(dtype), (x, mean, rstd, scale, bias)


def _layer_norm_gpu_bwd(eps, dtype, residuals, g):
  del eps, dtype
  x, mean, rstd, scale, bias = residuals
  f32 = jnp.float32
  normed = (x.astype(f32) - mean) * rstd
  dx, dscale, dbias = _layer_norm_grads(g.astype(f32), normed, rstd,
                                        scale.astype(f32), one_pass=True)
  return (dx.astype(x.dtype), dscale.astype(scale.dtype),
          dbias.astype(bias.dtype))


_layer_norm_gpu.defvjp(_layer_norm_gpu_fwd, _layer_norm_gpu_bwd)


class LayerNorm(nn.Module):
  """LayerNorm computed in float32 whatever the compute dtype.

  The official eps is 1e-12, which underflows in bfloat16; normalising in
  float32 keeps it meaningful. The backward pass keeps one array of the
  input's size (`_layer_norm`; on GPU `_layer_norm_gpu`), not three.
  """
  eps: float = 1e-12
  axis_name: str = "embed"
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., features] → [..., features] in `dtype`."""
    features = x.shape[-1]
    scale = self.param(
        "scale", nn.with_logical_partitioning(nn.initializers.ones,
                                              (self.axis_name,)),
        (features,), self.param_dtype)
    bias = self.param(
        "bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                             (self.axis_name,)),
        (features,), self.param_dtype)
    if compile_platform() == "gpu":
      return _layer_norm_gpu(x, scale, bias, self.eps, jnp.dtype(self.dtype))
    f32 = jnp.float32
    y = _layer_norm(x.astype(f32), scale.astype(f32), bias.astype(f32),
                    self.eps)
    return y.astype(self.dtype)


def mesh_split(logical_axis: str) -> int:
  """Into how many parts the current mesh and logical axis rules split the
  activation axis `logical_axis` (1 outside a mesh or without a rule)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return 1
  target = dict(nn.get_logical_axis_rules()).get(logical_axis)
  if target is None:
    return 1
  targets = (target,) if isinstance(target, str) else tuple(target)
  return math.prod(mesh.shape[t] for t in targets if t in mesh.axis_names)


def padded_size(size: int, multiple: int) -> int:
  """`size` rounded up to a multiple of `multiple`."""
  return -(-size // multiple) * multiple


def mask_padded_logits(logits: jax.Array, vocab_size: int) -> jax.Array:
  """[..., V'] logits with the columns from `vocab_size` on (the padding
  `Embed.attend` adds) at the dtype's lowest value: they get probability 0
  in a softmax, are never an argmax and never sampled."""
  if logits.shape[-1] == vocab_size:
    return logits
  ids = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  return jnp.where(ids < vocab_size, logits,
                   jnp.asarray(jnp.finfo(logits.dtype).min, logits.dtype))


class Embed(nn.Module):
  """A lookup table [num, features] that can also be read as a matrix.

  As a tied decoder (`attend`) under tensor parallelism, the table is
  padded with zero rows to a multiple of the devices that split the
  vocabulary (the logical axis "act_vocab"), as Megatron and MaxText pad
  theirs, so that the [..., V] logits split evenly whatever the vocabulary
  (BERT's 30522, RoBERTa's 50265, GPT-1's 40478). The padding exists only
  inside the computation: the stored table, its checkpoints, HF import and
  export and the parameter count keep `num_embeddings` rows (where the
  mesh does not divide them, `sharding.logical_shardings` stores the table
  whole along the vocabulary).
  """
  num_embeddings: int
  features: int
  axes: tuple[str, str] = ("vocab", "embed")
  init_range: float = 0.02
  initializer: str = "truncated_normal"
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def setup(self):
    self.embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(
            kernel_init(self.init_range, self.initializer), self.axes),
        (self.num_embeddings, self.features), self.param_dtype)

  def __call__(self, ids: jax.Array) -> jax.Array:
    """[...] int -> [..., features]."""
    return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

  def attend(self, x: jax.Array) -> jax.Array:
    """[..., features] -> [..., V']: x · tableᵀ (tied decoder).

    V' is `num_embeddings`, padded under a mesh that splits "act_vocab" to
    a multiple of that split; the padded columns are 0 here and need
    `mask_padded_logits` before a softmax.
    """
    table = self.embedding.astype(self.dtype)
    rows = padded_size(self.num_embeddings, mesh_split("act_vocab"))
    if rows != self.num_embeddings:
      table = jnp.pad(table, ((0, rows - self.num_embeddings), (0, 0)))
      table = nn.with_logical_constraint(table, ("act_vocab", "act_embedding"))
    return jnp.einsum("...e,ve->...v", x.astype(self.dtype), table)
