"""Library changes reverted, and candidates tried, while the step is traced.

`train_step.py` builds one extra albert_jax AdamW row per variant: a
`--unfix NAME` row has a change that the library has made switched back off
(the before/after of `UNFIXES`, in the same run), a `--fix NAME` row has a
candidate change (`FIXES`) switched on. Each entry is a context manager in
force while `JaxRunner` lowers the step, and/or ModelConfig overrides;
`a+b` combines several. A context manager swaps a library function for
another, or sets one of the encoder's benchmark seams on its class:
`AttentionBlock.project_qkv` (how Q, K and V are computed from their
parameters) and `FFNBlock.recompute_activation`. Nothing
here changes the library or copies its blocks: a candidate that measures
well is applied to albert_jax by hand, and then moves from FIXES to UNFIXES.
"""

import contextlib
import re

import jax
import jax.numpy as jnp

from albert_jax.model import encoder
from albert_jax.model import layers
from albert_jax.ops import attention as attention_ops


@contextlib.contextmanager
def _patched(owner, name, value):
  """`owner.name = value` (a module's function, a class's attribute) while
  the context lasts."""
  original = getattr(owner, name)
  setattr(owner, name, value)
  try:
    yield
  finally:
    setattr(owner, name, original)


################################################################################
# Changes the library has made, switched back off.
################################################################################


def plain_dense():
  """`layers.Dense` as the plain einsum whatever the backend: autodiff's
  weight gradient, dot(x, g) contracting B·T, on XLA:CPU's generic dot."""
  return _patched(layers, "compile_platform", lambda: "plain")


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


def ffn_keeps_activation():
  """`encoder.FFNBlock` as it was: autodiff keeps the activation's output
  (the output matmul's input) as well as its input."""
  return _patched(encoder.FFNBlock, "recompute_activation", False)


def key_bias():
  """`encoder.AttentionBlock` as it was: the key's bias added to the keys
  (softmax removes it again)."""
  library = encoder.AttentionBlock.project_qkv

  def with_key_bias(block, x):
    q, k, v, v_bias = library(block, x)
    if block.is_initializing():
      return q, k, v, v_bias
    bias = block.variables["params"]["key"]["bias"]
    return q, k + bias.astype(k.dtype), v, v_bias

  return _patched(encoder.AttentionBlock, "project_qkv", with_key_bias)


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


def _fused_qkv(project_qkv):
  """`encoder.AttentionBlock.project_qkv` as one [H, 3H] matmul: the query,
  key and value kernels concatenated at trace time, the query's bias added
  and the value's returned, as the library's does. Their parameters stay
  the three Dense layers' (`project_qkv`, the library's, creates them when
  the block is initialised)."""

  def fused(block, x):
    if block.is_initializing():
      return project_qkv(block, x)
    cfg = block.config
    params = [block.variables["params"][n] for n in ("query", "key", "value")]
    hidden = x.shape[-1]
    dtype = cfg.compute_dtype
    kernel = jnp.concatenate(
        [p["kernel"].astype(dtype).reshape(hidden, -1) for p in params], 1)
    x_in = x.astype(dtype)
    if layers.compile_platform() == "cpu":  # pylint: disable=protected-access
      y = layers._cpu_matmul(  # pylint: disable=protected-access
          x_in, kernel, 1, jax.config.jax_default_matmul_precision)
    else:
      y = x_in @ kernel
    y = y.reshape(x.shape[:-1] + (3, cfg.num_attention_heads, cfg.head_dim))
    q, k, v = (y[..., i, :, :] for i in range(3))
    return (q + params[0]["bias"].astype(dtype), k, v,
            params[2]["bias"].astype(dtype))

  return fused


def fused_qkv():
  """The layer scan's attention blocks compute Q, K, V in one matmul."""
  return _patched(encoder.AttentionBlock, "project_qkv",
                  _fused_qkv(encoder.AttentionBlock.project_qkv))


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
    "ffn_act_remat": ("encoder.FFNBlock: the activation's output kept for "
                      "the backward pass", {}, ffn_keeps_activation),
    "attn_rows": ("ops.attention: 1/√d on the logits, jax.nn.softmax, "
                  "padding queries zeroed in the probabilities", {},
                  attention_two_arrays),
    "key_bias": ("encoder.AttentionBlock: the key's bias added to the keys",
                 {}, key_bias),
    "layer_scan": ("model.layer_loop='scan': the layer scan as a loop on "
                   "every platform (auto unrolls it on GPU)",
                   {"layer_loop": "scan"}, contextlib.nullcontext),
}
FIXES = {
    "remat_dots": ("model.remat='dots': keep matmul outputs, recompute the "
                   "elementwise ops", {"remat": "dots"},
                   contextlib.nullcontext),
    "unroll": ("model.layer_loop='unroll': nn.scan(unroll=True) on every "
               "platform, no stacked residuals", {"layer_loop": "unroll"},
               contextlib.nullcontext),
    "fused_qkv": ("encoder.AttentionBlock: Q, K, V as one [H, 3H] matmul",
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
