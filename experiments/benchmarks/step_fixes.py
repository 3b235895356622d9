"""Candidate albert_jax fixes, patched in while the train step is traced.

`train_step.py --fix NAME` builds an extra albert_jax row with one (or,
joined by "+", several) of `FIXES`: each is a context manager that swaps a
library function for the candidate version while `JaxRunner` lowers the
step, and/or ModelConfig overrides. Nothing here changes the library: a fix
that measures well is applied to albert_jax itself by hand.
"""

import contextlib
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax import layers
from albert_jax import models
from albert_jax import train_step as step_lib


@jax.custom_jvp
def gelu_tanh(x):
  """tanh-approximate GELU whose derivative is one array.

  Autodiff of `jax.nn.gelu(approximate=True)` keeps x, x², tanh(·) and their
  products for the backward pass; inside the layer scan each becomes a
  stacked [layers, B, T, F] residual. This rule keeps only gelu'(x).
  """
  return jax.nn.gelu(x, approximate=True)


@gelu_tanh.defjvp
def _gelu_tanh_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  c = math.sqrt(2.0 / math.pi)
  th = jnp.tanh(c * (x + 0.044715 * x * x * x))
  y = 0.5 * x * (1.0 + th)
  dy = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * c * (
      1.0 + 3.0 * 0.044715 * x * x)
  return y, dy * t


@contextlib.contextmanager
def gelu_jvp():
  """`layers.activation` hands out `gelu_tanh` for the tanh GELU."""
  original = layers.activation
  layers.activation = lambda name: (
      gelu_tanh if name in ("gelu_new", "gelu_pytorch_tanh")
      else original(name))
  try:
    yield
  finally:
    layers.activation = original


@contextlib.contextmanager
def unroll_scan():
  """The encoder's `nn.scan` over layers, fully unrolled."""
  original = nn.scan
  models.nn.scan = lambda *a, **k: original(*a, unroll=True, **k)
  try:
    yield
  finally:
    models.nn.scan = original


@contextlib.contextmanager
def guard_barrier():
  """The train step's non-finite flags behind an optimization barrier."""
  original = step_lib.nonfinite_leaves
  step_lib.nonfinite_leaves = lambda grads: jax.lax.optimization_barrier(
      original(grads))
  try:
    yield
  finally:
    step_lib.nonfinite_leaves = original


@jax.custom_vjp
def _matmul(x, w):
  """[M, K] · [K, N], with the weight gradient as a canonical matmul."""
  return x @ w


def _matmul_fwd(x, w):
  return x @ w, (x, w)


def _matmul_bwd(residuals, g):
  x, w = residuals
  # Autodiff gives dW as dot(x, g) contracting both over M, which XLA:CPU
  # keeps transposed and runs on its slow generic dot; a materialised xᵀ
  # (fenced so that XLA cannot fold it back into the dot) makes it the
  # [K, M] · [M, N] matmul its fast (YNNPACK) path takes.
  xt = jax.lax.optimization_barrier(x.T)
  return g @ w.T, xt @ g


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


@contextlib.contextmanager
def dense_vjp():
  """Routes `layers.Dense`'s einsum ("...ab,abwx->...wx") through _matmul."""
  original = jnp.einsum

  def einsum(subscripts, *operands, **kwargs):
    inputs, _, out = subscripts.partition("->")
    parts = inputs.split(",")
    if (len(operands) != 2 or kwargs or len(parts) != 2
        or not parts[0].startswith("...")):
      return original(subscripts, *operands, **kwargs)
    contracted = parts[0][3:]
    if parts[1] != contracted + out[3:] or not out.startswith("..."):
      return original(subscripts, *operands, **kwargs)
    x, kernel = operands
    k = len(contracted)
    lead, features = x.shape[:x.ndim - k], kernel.shape[k:]
    y = _matmul(x.reshape(-1, math.prod(kernel.shape[:k])),
                kernel.reshape(math.prod(kernel.shape[:k]), -1))
    return y.reshape(lead + features)

  jnp.einsum = einsum
  try:
    yield
  finally:
    jnp.einsum = original


# name: (what it changes, ModelConfig overrides, trace-time patch).
FIXES = {
    "gelu_jvp": ("layers.activation: tanh GELU with a custom JVP",
                 {}, gelu_jvp),
    "remat_dots": ("model.remat='dots': keep matmul outputs, recompute the "
                   "elementwise ops", {"remat": "dots"},
                   contextlib.nullcontext),
    "unroll": ("models.Encoder: nn.scan(unroll=True), no stacked residuals",
               {}, unroll_scan),
    "dense_vjp": ("layers.Dense: custom VJP, weight gradient as xᵀ·g",
                  {}, dense_vjp),
    # XLA otherwise fuses the whole "all gradients finite" reduction into
    # every parameter and optimizer-slot update, once per leaf.
    "guard_barrier": ("train_step: optimization_barrier on the non-finite "
                      "flags, computed once", {}, guard_barrier),
}
