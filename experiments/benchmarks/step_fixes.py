"""Library changes reverted, and candidates tried, while the step is traced.

`train_step.py` builds one extra albert_jax AdamW row per variant: a
`--unfix NAME` row has a change that the library has made switched back off
(the before/after of `UNFIXES`, in the same run), a `--fix NAME` row has a
candidate change (`FIXES`) switched on. Each entry is a context manager that
swaps a library function for another while `JaxRunner` lowers the step,
and/or ModelConfig overrides; `a+b` combines several. Nothing here changes
the library: a candidate that measures well is applied to albert_jax by
hand, and then moves from FIXES to UNFIXES.
"""

import contextlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax import layers
from albert_jax import models
from albert_jax.ops import attention as attention_ops


@contextlib.contextmanager
def _patched(module, name, value):
  original = getattr(module, name)
  setattr(module, name, value)
  try:
    yield
  finally:
    setattr(module, name, original)


################################################################################
# Changes the library has made, switched back off.
################################################################################


def plain_dense():
  """`layers.Dense` as the plain einsum whatever the backend: autodiff's
  weight gradient, dot(x, g) contracting B·T, on XLA:CPU's generic dot."""
  return _patched(layers, "_compile_platform", lambda: "plain")


@contextlib.contextmanager
def autodiff_gelu():
  """Both GELUs as `jax.nn.gelu` differentiated by autodiff."""
  with _patched(layers, "gelu_tanh",
                lambda x: jax.nn.gelu(x, approximate=True)), _patched(
                    layers, "gelu_erf",
                    lambda x: jax.nn.gelu(x, approximate=False)):
    yield


def autodiff_layer_norm():
  """`layers.LayerNorm` differentiated by autodiff (three residuals)."""
  formula = layers._layer_norm_fwd  # pylint: disable=protected-access
  return _patched(layers, "_layer_norm",
                  lambda x, scale, bias, eps: formula(x, scale, bias, eps)[0])


class _FFNKeepingActivation(models.FFNBlock):
  """`models.FFNBlock` as it was: autodiff keeps the activation's output
  (the output matmul's input) as well as its input."""

  @nn.compact
  def __call__(self, x, deterministic):
    cfg = self.config
    kw = dict(init_range=cfg.initializer_range, dtype=cfg.compute_dtype,
              param_dtype=cfg.parameter_dtype)
    y = layers.Dense((cfg.intermediate_size,), ("embed", "mlp"),
                     name="intermediate", **kw)(x)
    y = layers.activation(cfg.hidden_act)(y)
    y = models._constrain(  # pylint: disable=protected-access
        y, ("batch", "length", "mlp"))
    y = layers.Dense((cfg.hidden_size,), ("mlp", "embed"), name="output",
                     **kw)(y)
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    y = layers.LayerNorm(cfg.layer_norm_eps, dtype=cfg.compute_dtype,
                         param_dtype=cfg.parameter_dtype,
                         name="layer_norm")(x + y)
    return models._constrain(  # pylint: disable=protected-access
        y, ("batch", "length", "embed"))


def ffn_keeps_activation():
  """The FFN's activation output kept for the backward pass (see above)."""
  return _patched(models, "FFNBlock", _FFNKeepingActivation)


def _attention_two_arrays(q, k, v, mask, dropout_rate, dropout_rng,
                          deterministic):
  """`attention._xla_attention` as it was: 1/√d on the [B, N, T, T]
  logits, `jax.nn.softmax` (autodiff keeps exp(x - max) and the output),
  and queries that see no key zeroed in the probabilities."""
  depth = q.shape[-1]
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                      preferred_element_type=jnp.float32)
  logits = logits * (1.0 / jnp.sqrt(depth).astype(jnp.float32))
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  if mask is not None:
    probs = jnp.where(mask, probs, 0.0)
  if not deterministic and dropout_rate > 0.0:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)


def attention_two_arrays():
  """See `_attention_two_arrays`."""
  return _patched(attention_ops, "_xla_attention", _attention_two_arrays)


################################################################################
# Candidates.
################################################################################


def unroll_scan():
  """The encoder's `nn.scan` over layers, fully unrolled."""
  original = nn.scan
  return _patched(models.nn, "scan",
                  lambda *a, **k: original(*a, unroll=True, **k))


class _DenseWeights(nn.Module):
  """A `layers.Dense`'s parameters (same names, init and logical axes),
  returned in the compute dtype instead of applied."""
  features: tuple[int, ...]
  axes: tuple[str, ...]
  in_shape: tuple[int, ...]
  init_range: float = 0.02
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self):
    kernel = self.param(
        "kernel", nn.with_logical_partitioning(
            layers.kernel_init(self.init_range), self.axes),
        self.in_shape + self.features, self.param_dtype)
    bias = self.param(
        "bias", nn.with_logical_partitioning(
            nn.initializers.zeros, self.axes[len(self.in_shape):]),
        self.features, self.param_dtype)
    return kernel.astype(self.dtype), bias.astype(self.dtype)


class _FusedQKVBlock(models.AttentionBlock):
  """`models.AttentionBlock` with Q, K and V as one [H, 3H] matmul.

  The parameters stay three Dense layers (query, key, value); their kernels
  are concatenated at trace time.
  """

  @nn.compact
  def __call__(self, x, segment_ids, deterministic):
    cfg = self.config
    kw = dict(init_range=cfg.initializer_range, dtype=cfg.compute_dtype,
              param_dtype=cfg.parameter_dtype)
    heads = (cfg.num_attention_heads, cfg.head_dim)
    weights = [_DenseWeights(heads, ("embed", "heads", "kv"), x.shape[-1:],
                             name=n, **kw)() for n in ("query", "key", "value")]
    hidden = x.shape[-1]
    kernel = jnp.concatenate([w.reshape(hidden, -1) for w, _ in weights], 1)
    bias = jnp.concatenate([b.reshape(-1) for _, b in weights])
    x_in = x.astype(cfg.compute_dtype)
    if layers._compile_platform() == "cpu":  # pylint: disable=protected-access
      y = layers._cpu_matmul(  # pylint: disable=protected-access
          x_in, kernel, 1, jax.config.jax_default_matmul_precision)
    else:
      y = x_in @ kernel
    y = (y + bias).reshape(x.shape[:-1] + (3,) + heads)
    q, k, v = (models._constrain(  # pylint: disable=protected-access
        y[..., i, :, :], ("batch", "length", "heads", "kv")) for i in range(3))
    dropout = cfg.attention_probs_dropout_prob
    needs_rng = not deterministic and dropout > 0.0
    context = attention_ops.dot_product_attention(
        q, k, v, segment_ids=segment_ids, dropout_rate=dropout,
        dropout_rng=self.make_rng("dropout") if needs_rng else None,
        deterministic=deterministic, impl=cfg.attention_impl,
        causal=cfg.causal)
    y = layers.Dense((cfg.hidden_size,), ("heads", "kv", "embed"), contract=2,
                     name="output", **kw)(context)
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    y = layers.LayerNorm(cfg.layer_norm_eps, dtype=cfg.compute_dtype,
                         param_dtype=cfg.parameter_dtype,
                         name="layer_norm")(x + y)
    return models._constrain(  # pylint: disable=protected-access
        y, ("batch", "length", "embed"))


def fused_qkv():
  """The layer scan's attention blocks compute Q, K, V in one matmul."""
  return _patched(models, "AttentionBlock", _FusedQKVBlock)


def _swapped_matmul_bwd(contract, precision, residuals, g):
  """`layers._cpu_matmul`'s backward, with dW = (gᵀ·x)ᵀ where the kernel is
  taller than wide (K > N): the transposed operand is then [M, N], not
  [M, K], and the matmul [N, M] · [M, K]."""
  x, kernel = residuals
  as_matrices = layers._as_matrices  # pylint: disable=protected-access
  x2, k2 = as_matrices(x, kernel, contract)
  g2 = g.reshape(x2.shape[0], k2.shape[1])
  dx = jnp.dot(g2, k2.T, precision=precision).reshape(x.shape)
  if k2.shape[0] > k2.shape[1]:
    gt = jax.lax.optimization_barrier(g2.T)
    dk = jnp.dot(gt, x2, precision=precision).T
  else:
    dk = jnp.dot(jax.lax.optimization_barrier(x2.T), g2, precision=precision)
  return dx, dk.reshape(kernel.shape)


# The same forward as layers._cpu_matmul (its undecorated function).
_swapped_matmul = jax.custom_vjp(
    layers._cpu_matmul.fun,  # pylint: disable=protected-access
    nondiff_argnums=(2, 3))
_swapped_matmul.defvjp(
    lambda x, kernel, contract, precision: (
        _swapped_matmul(x, kernel, contract, precision), (x, kernel)),
    _swapped_matmul_bwd)


def dw_swap():
  """See `_swapped_matmul_bwd`."""
  return _patched(layers, "_cpu_matmul", _swapped_matmul)


# name: (what it changes, ModelConfig overrides, trace-time patch).
UNFIXES = {
    "dense_vjp": ("layers.Dense: plain einsum, autodiff's weight gradient",
                  {}, plain_dense),
    "gelu_jvp": ("layers.activation: jax.nn.gelu, autodiff's derivative",
                 {}, autodiff_gelu),
    "layer_norm_vjp": ("layers.LayerNorm: autodiff's backward, three "
                       "residuals", {}, autodiff_layer_norm),
    "ffn_act_remat": ("models.FFNBlock: the activation's output kept for "
                      "the backward pass", {}, ffn_keeps_activation),
    "attn_rows": ("ops.attention: 1/√d on the logits, jax.nn.softmax, "
                  "padding queries zeroed in the probabilities", {},
                  attention_two_arrays),
}
FIXES = {
    "remat_dots": ("model.remat='dots': keep matmul outputs, recompute the "
                   "elementwise ops", {"remat": "dots"},
                   contextlib.nullcontext),
    "unroll": ("models.Encoder: nn.scan(unroll=True), no stacked residuals",
               {}, unroll_scan),
    "fused_qkv": ("models.AttentionBlock: Q, K, V as one [H, 3H] matmul",
                  {}, fused_qkv),
    "dw_swap": ("layers.Dense on CPU: dW = (gᵀ·x)ᵀ for kernels taller than "
                "wide", {}, dw_swap),
}


def variant(spec: str) -> list[tuple[str, str]]:
  """"+a+b-c" → [("+", "a"), ("+", "b"), ("-", "c")], checked."""
  parts = re.findall(r"([+-])([^+-]+)", spec)
  if not parts or "".join(s + n for s, n in parts) != spec:
    raise ValueError(f"Variant {spec!r}: write +name or -name, joined.")
  for sign, name in parts:
    table = FIXES if sign == "+" else UNFIXES
    if name not in table:
      raise ValueError(f"Unknown {'fix' if sign == '+' else 'unfix'} "
                       f"{name!r}; choose from {sorted(table)}.")
  return parts


def changes(spec: str):
  """The (overrides, patch) pairs of a variant spec."""
  return [(FIXES if sign == "+" else UNFIXES)[name][1:]
          for sign, name in variant(spec)]
