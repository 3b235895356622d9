"""Scaled dot-product attention behind one entry point.

Every attention call in the model goes through `dot_product_attention`, so a
kernel can be swapped in by name (`model.attention_impl`) without touching the
model. Masking is expressed with segment ids rather than an additive mask:
id 0 is padding, and a query attends to the keys that carry its own id. That
one convention covers padded batches and packed sequences alike, and it is the
form flash kernels take. `causal=True` (GPT-style left-to-right models) also
hides every key after the query: key j is seen by query i only if j <= i,
counted from the start of the row, as `jax.nn.dot_product_attention`'s
`is_causal` does. Packed sequences stay causal within themselves, since their
tokens are contiguous.

Implementations:
  xla     the reference: einsum, softmax, einsum; the only one with dropout.
  pallas  this package's flash-attention kernels: the Mosaic TPU kernel on
          TPU (`flash_tpu`), the same kernel in TPU interpret mode on CPU
          (for tests; slow), the Mosaic GPU kernel on Hopper (`flash_gpu`).
  cudnn   cuDNN's fused attention through `jax.nn.dot_product_attention`;
          with `right_padded` rows, its padding mask from row lengths.
  auto    pallas on TPU; on GPU whichever of pallas and cudnn ran faster on
          the H100 for the call's length, mask and pass (`hopper_rates`,
          measured), cudnn where the kernel cannot take the inputs; xla on
          CPU; each where it takes the inputs (else xla).
The platform is that of the devices the step is compiled for: under a mesh
(`jax.set_mesh`, as the trainer jits its steps) the mesh's devices, else the
default backend. So a train step compiled ahead of time from a CPU host for
a TPU topology (`albert_jax.tools.compile_only --topology`) holds the Mosaic
kernels, exactly as on the TPU itself.
A kernel without dropout hands a call with active dropout to xla, and says
so once in the log; likewise the Mosaic GPU kernel, which has no causal
masking, hands causal calls to cudnn (or xla where cuDNN cannot take them).
Under a multi-device mesh (`jax.set_mesh`) a Pallas kernel runs per device
on its share of the batch and heads (`shard_map`); interpret mode on CPU
needs a one-device mesh. The kernel modules import lazily: importing the
model does not import Pallas.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from albert_jax.ops import hopper_rates

logger = logging.getLogger(__name__)

# "xla" is the reference every other path is tested against.
IMPLEMENTATIONS = ("auto", "xla", "pallas", "cudnn")
# cuDNN's flash attention (jax.nn.dot_product_attention) takes half types
# and head_dim a multiple of 8 up to 128 (256 on Hopper; 128 is safe).
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# Mesh axes over which albert_jax.sharding's rules split activations: the
# batch over data and fsdp, the heads over tensor. A Pallas kernel is a
# custom call that XLA's partitioner cannot split, so under a multi-device
# mesh it runs per shard inside shard_map (else every device would gather
# the whole batch and compute all of it).
_BATCH_AXES = ("data", "fsdp")
_HEAD_AXES = ("tensor",)


def segment_mask(q_segment_ids: jax.Array,
                 kv_segment_ids: jax.Array) -> jax.Array:
  """Boolean attention mask from segment ids.

  Args:
    q_segment_ids: [batch, q_len] int, 0 = padding.
    kv_segment_ids: [batch, kv_len] int, 0 = padding.

  Returns:
    [batch, 1, q_len, kv_len] bool, True where the query may attend the key.
  """
  q = q_segment_ids[:, :, None]
  kv = kv_segment_ids[:, None, :]
  return ((q == kv) & (kv != 0))[:, None, :, :]


def causal_mask(q_len: int, kv_len: int) -> jax.Array:
  """[1, 1, q_len, kv_len] bool, True where key j <= query i (the diagonal
  starts at the top-left corner, as in `jax.nn.dot_product_attention`)."""
  rows = jnp.arange(q_len)[:, None]
  cols = jnp.arange(kv_len)[None, :]
  return (cols <= rows)[None, None]


def _check_shapes(q, k, v, segment_ids, kv_segment_ids):
  """Refuses mismatched inputs with a message naming every shape."""
  shapes = f"got q {q.shape}, k {k.shape}, v {v.shape}"
  if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
    raise ValueError("q, k, v must be [batch, seq, heads, head_dim] with k "
                     f"and v of one shape; {shapes}.")
  if (q.shape[0], q.shape[2:]) != (k.shape[0], k.shape[2:]):
    raise ValueError("q, k, v must agree in batch, heads and head_dim; "
                     f"{shapes}.")
  if segment_ids is None:
    if kv_segment_ids is not None:
      raise ValueError("kv_segment_ids needs segment_ids (the queries' ids).")
    return
  if segment_ids.shape != q.shape[:2]:
    raise ValueError(f"segment_ids must be [batch, q_len] = {q.shape[:2]}, "
                     f"got {segment_ids.shape}.")
  kv_ids = segment_ids if kv_segment_ids is None else kv_segment_ids
  if kv_ids.shape != k.shape[:2]:
    name = "segment_ids" if kv_segment_ids is None else "kv_segment_ids"
    raise ValueError(f"{name} must be [batch, kv_len] = {k.shape[:2]} for "
                     f"the keys, got {kv_ids.shape}.")


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _softmax(logits: jax.Array, dtype) -> jax.Array:
  """Softmax over the last axis of float32 `logits`, returned in `dtype`.

  Its backward pass keeps only the output, in `dtype`, which the context
  einsum's backward needs anyway: autodiff of the formula would keep
  exp(x - max) and the float32 probabilities as well as their `dtype` copy
  (three [batch, heads, q_len, kv_len] arrays per layer in bfloat16, two in
  float32, where this keeps one).
  """
  unnormalized = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
  return (unnormalized / jnp.sum(unnormalized, axis=-1, keepdims=True)
          ).astype(dtype)


def _softmax_fwd(logits, dtype):
  probs = _softmax(logits, dtype)
  return probs, probs


def _softmax_bwd(dtype, probs, g):
  del dtype
  y, g = probs.astype(jnp.float32), g.astype(jnp.float32)
  return (y * (g - jnp.sum(y * g, axis=-1, keepdims=True)),)


_softmax.defvjp(_softmax_fwd, _softmax_bwd)


def _xla_attention(q, k, v, mask, dropout_rate, dropout_rng, deterministic):
  """Reference path: [batch, seq, heads, head_dim] in and out.

  `mask` is [batch or 1, 1, q_len, kv_len] bool or None. The backward pass
  keeps one [batch, heads, q_len, kv_len] array (the probabilities, in v's
  dtype) besides the mask: 1/√d scales q rather than the logits, the
  softmax's derivative needs only its output, and a query that sees no key
  is zeroed in the [batch, q_len, heads, head_dim] output rather than in
  the probabilities.
  """
  # In q's dtype: exact for head_dim 64 (1/8) and within the rounding the
  # bf16 logits carry anyway otherwise.
  q = q * jnp.asarray(q.shape[-1] ** -0.5, q.dtype)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                      preferred_element_type=jnp.float32)
  if mask is not None:
    # finfo.min rather than -inf: a row with no valid key stays finite (a
    # uniform row, zeroed in the output below) instead of turning into NaN;
    # in any other row a masked key's probability is exactly 0.
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = _softmax(logits, v.dtype)
  if not deterministic and dropout_rate > 0.0:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / jnp.asarray(1.0 - dropout_rate,
                                                 probs.dtype), 0.0)
  out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
  if mask is not None:
    sees = jnp.any(mask, axis=-1)[:, 0, :, None, None]  # [batch, q_len, 1, 1]
    out = jnp.where(sees, out, 0.0)
  return out


def _cudnn_attention(q, k, v, mask, causal, lengths=None):
  """cuDNN's fused attention. With `lengths` ([batch] valid tokens of
  right-padded rows) it takes its padding mask: no [B, 1, T, T] bias to
  build, read and differentiate, key tiles past a row's length skipped, and
  query rows past it zeros (the padding mask's contract, as
  `jax.nn.dot_product_attention`'s reference path computes it)."""
  if lengths is not None:
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, query_seq_lengths=lengths,
        key_value_seq_lengths=lengths, implementation="cudnn")
  out = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal,
                                     implementation="cudnn")
  if mask is not None:
    # cuDNN leaves rows with no valid key undefined; the contract is zeros.
    if causal:
      mask = mask & causal_mask(q.shape[1], k.shape[1])
    row_valid = jnp.any(mask, axis=-1)[:, 0, :, None, None]
    out = jnp.where(row_valid, out, 0)
  return out


def _kernel_module(backend: str):
  """The Pallas kernel module for a backend (imported on first use)."""
  name = {"tpu": "flash_tpu", "cpu": "flash_tpu", "gpu": "flash_gpu"}.get(
      backend)
  if name is None:
    raise ValueError(
        f"impl='pallas' has no kernel for the {backend!r} backend (TPU, GPU, "
        "or CPU in interpret mode); use impl='xla'.")
  return importlib.import_module(f"albert_jax.ops.{name}")


def _cudnn_unsupported(q) -> str | None:
  if jnp.dtype(q.dtype) not in _CUDNN_DTYPES:
    return f"cuDNN attention takes float16/bfloat16, not {q.dtype}"
  if q.shape[-1] % 8 or q.shape[-1] > 128:
    return (f"cuDNN attention takes head_dim a multiple of 8 up to 128, not "
            f"{q.shape[-1]}")
  return None


def _mesh_axes(mesh, names, size):
  """The axes of `names` in `mesh` (size > 1) whose product divides size."""
  chosen = []
  for name in names:
    if name in mesh.axis_names and mesh.shape[name] > 1:
      product = math.prod(mesh.shape[a] for a in chosen) * mesh.shape[name]
      if size % product == 0:
        chosen.append(name)
  return tuple(chosen) or None


def _per_shard(kernel, q, k, v, q_ids, kv_ids):
  """Runs kernel(q, k, v, q_ids, kv_ids) on each device's batch and heads.

  Without a mesh (or with one device) this is a plain call. Batch and
  heads are independent in attention, so splitting them is exact; mesh axes
  that do not divide them are left replicated.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return kernel(q, k, v, q_ids, kv_ids)
  batch = _mesh_axes(mesh, _BATCH_AXES, q.shape[0])
  heads = _mesh_axes(mesh, _HEAD_AXES, q.shape[2])
  spec, ids_spec = P(batch, None, heads, None), P(batch, None)
  if q_ids is None:
    return jax.shard_map(lambda q, k, v: kernel(q, k, v, None, None),
                         in_specs=(spec,) * 3, out_specs=spec,
                         check_vma=False)(q, k, v)
  return jax.shard_map(kernel, in_specs=(spec,) * 3 + (ids_spec,) * 2,
                       out_specs=spec, check_vma=False)(q, k, v, q_ids,
                                                        kv_ids)


def target_platform() -> str:
  """"tpu", "gpu" or "cpu": the platform the traced computation compiles for.

  Under a mesh that is its devices' platform, which need not be the default
  backend (a TPU topology compiled ahead of time from a CPU host); without
  one, jit compiles for the default backend's devices.
  """
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else mesh.abstract_device
  platform = device.platform if device is not None else jax.default_backend()
  return {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)


@functools.lru_cache(maxsize=None)
def _log_once(message: str) -> None:
  """Logs each distinct fallback once per process, not once per trace."""
  logger.warning(message)


def _gpu_auto(q, k, v, causal: bool, segments: bool, right_padded: bool,
              training: bool) -> tuple[str, str | None]:
  """(choice, why not) of impl="auto" on a GPU: cuDNN, or the Mosaic GPU
  kernel where it takes the inputs and ran faster on the H100 for this
  sequence length, mask and pass (`hopper_rates`): the kernel compares
  segment ids, cuDNN takes sequence lengths for right-padded rows and a
  dense bias for any other mask."""
  cudnn_reason = _cudnn_unsupported(q)
  if causal or _kernel_module("gpu").check_supported(q, k, v):
    return "cudnn", cudnn_reason
  if cudnn_reason:
    return "pallas", None
  cudnn_mask = ("none" if not segments else "lengths" if right_padded
                else "padded")
  return hopper_rates.faster(q.shape[1], "padded" if segments else "none",
                             cudnn_mask, training), None


def _choose(impl: str, q, k, v, use_dropout: bool, backend: str,
            causal: bool = False, segments: bool = False,
            right_padded: bool = False, training: bool = True) -> str:
  """Resolves `impl` to the path that runs: "xla", "pallas" or "cudnn"."""
  if impl == "auto":
    if backend == "tpu":
      reason = _kernel_module(backend).check_supported(q, k, v)
      chosen = "pallas"
    elif backend == "gpu":
      chosen, reason = _gpu_auto(q, k, v, causal, segments, right_padded,
                                 training)
    else:
      return "xla"
    if reason:
      _log_once(f"attention impl='auto' on {backend}: using xla, because "
                f"{reason}.")
      return "xla"
  elif impl == "pallas" and causal and backend == "gpu":
    # The Hopper kernel has no causal variant (it streams every key block);
    # cuDNN's causal flash attention skips the blocks above the diagonal.
    reason = _cudnn_unsupported(q)
    chosen = "xla" if reason else "cudnn"
    _log_once("attention: the Mosaic GPU kernel has no causal masking, so "
              f"causal calls run on {chosen}"
              + (f", because {reason}." if reason else "."))
  elif impl == "pallas":
    reason = _kernel_module(backend).check_supported(q, k, v)
    if reason:
      raise ValueError(f"impl='pallas' on {backend}: {reason}.")
    chosen = "pallas"
  else:
    chosen = impl
  if use_dropout and chosen != "xla":
    _log_once(f"attention: the {chosen} kernel has no attention dropout, so "
              "calls with dropout active run on xla (set "
              "model.attention_probs_dropout_prob=0 to use the kernel).")
    return "xla"
  return chosen


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
    impl: str = "auto",
    causal: bool = False,
    right_padded: bool = False,
) -> jax.Array:
  """Multi-head attention softmax(q kᵀ / √d) v with segment masking.

  Args:
    q: [batch, q_len, heads, head_dim].
    k: [batch, kv_len, heads, head_dim].
    v: [batch, kv_len, heads, head_dim].
    segment_ids: [batch, q_len] int; 0 marks padding, equal ids attend to each
      other. None means every position is valid and in one segment.
    kv_segment_ids: [batch, kv_len]; defaults to `segment_ids`.
    dropout_rate: attention-probability dropout, applied when not
      `deterministic`.
    dropout_rng: PRNG key for dropout.
    deterministic: disables dropout.
    impl: one of `IMPLEMENTATIONS` (see the module docstring). "pallas"
      refuses inputs its kernel cannot take (head_dim, dtype) with a
      ValueError; "auto" runs those on xla. Any kernel hands calls with
      active dropout to xla.
    causal: also mask every key after the query (key j > query i), for
      left-to-right models.
    right_padded: the caller's promise that every row of `segment_ids` is
      one sequence followed by padding (non-zero ids, then zeros), as the
      pre-training loader writes its rows. cuDNN then takes each row's
      length instead of a mask (no [B, 1, T, T] bias); the result is the
      same. Rows that break the promise get attention over their first
      `count(ids != 0)` tokens, so only a caller that builds its rows
      that way may set it.

  Returns:
    [batch, q_len, heads, head_dim] in q's dtype. Query rows whose segment id
    is 0 (or that see no valid key) are zeros.
  """
  if impl not in IMPLEMENTATIONS:
    raise ValueError(
        f"Unknown attention implementation {impl!r}; choose one of "
        f"{IMPLEMENTATIONS} (set model.attention_impl).")
  _check_shapes(q, k, v, segment_ids, kv_segment_ids)
  kv_ids_given = kv_segment_ids is not None
  if kv_segment_ids is None:
    kv_segment_ids = segment_ids
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}.")
  use_dropout = not deterministic and dropout_rate > 0.0
  if use_dropout and dropout_rng is None:
    raise ValueError("Attention dropout needs dropout_rng.")
  backend = target_platform()
  chosen = _choose(impl, q, k, v, use_dropout, backend, causal,
                   segment_ids is not None, right_padded, not deterministic)
  if chosen == "pallas":
    module = _kernel_module(backend)
    # Only the TPU kernel takes `causal` (GPU causal calls went to cudnn).
    kwargs = {"causal": True} if causal else {}
    if backend == "cpu":
      if jax.sharding.get_abstract_mesh().size > 1:
        # Its host callbacks and the CPU collectives wait on each other.
        raise ValueError(
            "impl='pallas' on CPU runs the TPU kernel in interpret mode, "
            "which cannot run under a multi-device mesh; use impl='xla' or "
            "a one-device mesh (to compile the Mosaic kernels for a TPU "
            "slice from this host: --compile_only --topology=v5e:4x4).")
      kwargs["interpret"] = module.interpret_params()
    kernel = functools.partial(module.flash_attention, **kwargs)
    out = _per_shard(kernel, q, k, v, segment_ids, kv_segment_ids)
    return out.astype(q.dtype)
  # Self-attention over right-padded rows: cuDNN takes the rows' lengths.
  lengths = None
  if (chosen == "cudnn" and right_padded and segment_ids is not None
      and not kv_ids_given):
    lengths = jnp.sum(segment_ids != 0, axis=1, dtype=jnp.int32)
  mask = None
  if segment_ids is not None and lengths is None:
    mask = segment_mask(segment_ids, kv_segment_ids)
  if chosen == "cudnn":
    out = _cudnn_attention(q, k, v, mask, causal, lengths)
  else:
    if causal:
      tril = causal_mask(q.shape[1], k.shape[1])
      mask = tril if mask is None else mask & tril
    out = _xla_attention(q, k, v, mask, dropout_rate, dropout_rng,
                         deterministic)
  return out.astype(q.dtype)
