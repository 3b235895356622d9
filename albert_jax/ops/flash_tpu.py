"""Flash attention for TPU as Pallas (Mosaic) kernels, with segment ids.

The public function takes the model's [batch, seq, heads, head_dim] layout,
pads the sequences to whole blocks (padding gets segment id 0), moves heads
in front of the sequence ([batch, heads, seq, head_dim], the layout whose
last two dimensions tile onto the TPU's (sublane, lane) grid) and calls a
`jax.custom_vjp` around three kernels:

  forward  online softmax over key blocks; saves the log-sum-exp per query;
  dq       per query block, loops over key blocks;
  dk/dv    per key block, loops over query blocks, in the transposed
           orientation (keys on sublanes) so that no [block, block] tile
           needs a transpose.

Masking follows `albert_jax.ops.attention`: a query attends the keys that
carry its own non-zero segment id, and with `causal=True` only those at or
before its own position. Probabilities of masked pairs are set to exactly 0
after the exponential, so a row that sees no key has a zero normaliser; its
output and every gradient through it are zeros, not NaN. Block pairs whose
ranges of segment ids cannot meet (padding blocks, other packed sequences)
skip their compute, and so, under causal masking, do key blocks entirely
after the query block: about half of all pairs, whose tiles are not even
copied in (see `flash_tpu_common.Walk`).

On CPU the same kernels run in TPU interpret mode (`interpret=` a
`pltpu.InterpretParams`), which is how they are tested.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp

from albert_jax.ops import flash_tpu_bwd
from albert_jax.ops.flash_common import padded_segment_ids
from albert_jax.ops.flash_tpu_common import LANES
from albert_jax.ops.flash_tpu_common import lanes
from albert_jax.ops.flash_tpu_common import MASK_VALUE
from albert_jax.ops.flash_tpu_common import matmul
from albert_jax.ops.flash_tpu_common import NT_DIMS
from albert_jax.ops.flash_tpu_common import Static
from albert_jax.ops.flash_tpu_common import Walk

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes of the three kernels, in tokens along each sequence.

  Each must be a positive multiple of 128 (the lane width). A block larger
  than the padded sequence is clipped to it; otherwise the largest multiple
  of 128 that is at most the requested size and divides the padded length
  is used, so sequences are padded only to a multiple of 128. The sizes
  change speed, not results (beyond float summation order).

  Attributes:
    block_q: forward, queries per tile.
    block_kv: forward, keys per tile.
    block_q_dq: dq kernel, queries per tile.
    block_kv_dq: dq kernel, keys per tile.
    block_q_dkv: dk/dv kernel, queries per tile.
    block_kv_dkv: dk/dv kernel, keys per tile.
  """
  block_q: int = 512
  block_kv: int = 512
  block_q_dq: int = 512
  block_kv_dq: int = 512
  block_q_dkv: int = 512
  block_kv_dkv: int = 512

  def __post_init__(self):
    for field in dataclasses.fields(self):
      size = getattr(self, field.name)
      if not isinstance(size, int) or size <= 0 or size % LANES:
        raise ValueError(
            f"BlockSizes.{field.name}={size!r}: block sizes must be positive "
            f"multiples of {LANES} (the TPU lane width).")


class _Blocks(NamedTuple):
  """Block sizes resolved against the padded lengths (hashable, static)."""
  q: int
  kv: int
  q_dq: int
  kv_dq: int
  q_dkv: int
  kv_dkv: int


def _fit(block: int, length: int) -> int:
  """Largest multiple of LANES ≤ block dividing length (a LANES multiple)."""
  units = length // LANES
  for size in range(min(block, length) // LANES, 0, -1):
    if units % size == 0:
      return size * LANES
  raise AssertionError("unreachable: 1 always divides")


def check_supported(q: jax.Array, k: jax.Array, v: jax.Array) -> str | None:
  """Why the kernel cannot take these inputs, or None if it can.

  Args:
    q: [batch, q_len, heads, head_dim].
    k: [batch, kv_len, heads, head_dim].
    v: [batch, kv_len, heads, head_dim].
  """
  head_dim = q.shape[-1]
  if head_dim != 64 and head_dim % LANES:
    return (f"head_dim {head_dim} is not supported by the Pallas TPU kernel "
            f"(it takes 64 or a multiple of {LANES}); use impl='xla' or "
            "change the model's hidden_size / num_attention_heads")
  dtypes = {jnp.dtype(t.dtype) for t in (q, k, v)}
  if len(dtypes) != 1 or not dtypes <= set(SUPPORTED_DTYPES):
    return (f"the Pallas TPU kernel takes q, k, v all float32 or all "
            f"bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
  return None


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    *,
    block_sizes: BlockSizes | None = None,
    interpret: pltpu.InterpretParams | None = None,
    causal: bool = False,
) -> jax.Array:
  """softmax(q kᵀ / √head_dim) v with segment masking, as Pallas TPU kernels.

  Args:
    q: [batch, q_len, heads, head_dim], float32 or bfloat16; head_dim 64 or
      a multiple of 128.
    k: [batch, kv_len, heads, head_dim], q's dtype.
    v: [batch, kv_len, heads, head_dim], q's dtype.
    q_segment_ids: [batch, q_len] int, 0 = padding; None = all one segment.
    kv_segment_ids: [batch, kv_len] int; defaults to `q_segment_ids`.
    block_sizes: tile sizes; None = `BlockSizes()`.
    interpret: None compiles for TPU; a `pltpu.InterpretParams` runs the
      kernels in TPU interpret mode (on CPU).
    causal: also mask every key after the query (key j > query i, from the
      start of the row); skips the key blocks entirely after each query
      block.

  Returns:
    [batch, q_len, heads, head_dim] in q's dtype; rows whose query sees no
    key are zeros. Differentiable in q, k and v.
  """
  reason = check_supported(q, k, v)
  if reason:
    raise ValueError(reason[0].upper() + reason[1:] + ".")
  batch, q_len, _, head_dim = q.shape
  kv_len = k.shape[1]
  q_pad = -q_len % LANES
  kv_pad = -kv_len % LANES
  ids = padded_segment_ids(q_segment_ids, kv_segment_ids, batch, q_len,
                           kv_len, q_pad, kv_pad)

  def to_kernel_layout(x, pad):  # [B, T, H, D] → [B, H, T + pad, D]
    return jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

  qt = to_kernel_layout(q, q_pad)
  kt = to_kernel_layout(k, kv_pad)
  vt = to_kernel_layout(v, kv_pad)
  sizes = block_sizes or BlockSizes()
  lq, lk = q_len + q_pad, kv_len + kv_pad
  blocks = _Blocks(_fit(sizes.block_q, lq), _fit(sizes.block_kv, lk),
                   _fit(sizes.block_q_dq, lq), _fit(sizes.block_kv_dq, lk),
                   _fit(sizes.block_q_dkv, lq), _fit(sizes.block_kv_dkv, lk))
  static = Static(scale=1.0 / math.sqrt(head_dim), masked=ids.masked,
                  blocks=blocks, interpret=interpret, causal=bool(causal))
  out = _flash(qt, kt, vt, ids.q, ids.kv, static)
  return out.transpose(0, 2, 1, 3)[:, :q_len]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, q_ids, kv_ids, static):
  """[B, H, Lq, D] attention in kernel layout; see `flash_attention`."""
  return _forward(q, k, v, q_ids, kv_ids, static)[0]


def _flash_fwd(q, k, v, q_ids, kv_ids, static):
  out, lse = _forward(q, k, v, q_ids, kv_ids, static)
  return out, (q, k, v, q_ids, kv_ids, out, lse)


def _flash_bwd(static, residuals, d_out):
  q, k, v, q_ids, kv_ids, out, lse = residuals
  # di = rowsum(dO ∘ O) = rowsum(dP ∘ P): the softmax-Jacobian term, one
  # float per query, cheaper here than inside both kernels.
  di = jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1)
  dq = flash_tpu_bwd.dq(q, k, v, q_ids, kv_ids, d_out, lse, di, static)
  dk, dv = flash_tpu_bwd.dkv(q, k, v, q_ids, kv_ids, d_out, lse, di, static)
  return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _forward_kernel(*refs, walk: Walk):
  """One (batch, head, q block, kv block) step of the online softmax."""
  r = walk.refs(refs, 3)
  q_ref, k_ref, v_ref = r.inputs
  o_ref, lse_ref, m_scratch, l_scratch, acc_scratch = r.rest
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  head_dim = q_ref.shape[-1]

  @pl.when(j == 0)
  def _init():
    m_scratch[...] = jnp.full(m_scratch.shape, -jnp.inf, jnp.float32)
    l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
    acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

  def step():
    s = matmul(q_ref[...], k_ref[...], NT_DIMS) * walk.static.scale
    block_kv = s.shape[1]
    mask = walk.tile_mask(r, i, j, s.shape)
    if mask is not None:
      s = jnp.where(mask, s, MASK_VALUE)
    m_prev = m_scratch[...]  # [block_q, LANES], equal across lanes
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    p = jnp.exp(s - lanes(m_next, block_kv))
    if mask is not None:
      # A row with no valid key so far has m_next = MASK_VALUE and p = 1 on
      # its masked pairs; zeroing them keeps its normaliser at exactly 0.
      p = jnp.where(mask, p, 0.0)
    alpha = jnp.exp(m_prev - m_next)
    l_scratch[...] = alpha * l_scratch[...] + jnp.sum(p, axis=1, keepdims=True)
    m_scratch[...] = m_next
    v = v_ref[...]
    acc_scratch[...] = acc_scratch[...] * lanes(alpha, head_dim) + matmul(
        p.astype(v.dtype), v)

  walk.run(step, r, b, i, j)

  @pl.when(j == walk.num_kv - 1)
  def _finish():
    l = l_scratch[...]
    seen = l > 0.0
    inv = jnp.where(seen, 1.0 / jnp.where(seen, l, 1.0), 0.0)
    o_ref[...] = (acc_scratch[...] * lanes(inv, head_dim)).astype(o_ref.dtype)
    # Rows that saw no key keep lse 0: every backward probability of theirs
    # is masked to 0 whatever lse is.
    lse_ref[...] = jnp.where(seen, m_scratch[...] + jnp.log(
        jnp.where(seen, l, 1.0)), 0.0)


def _forward(q, k, v, q_ids, kv_ids, static: Static):
  """Runs the forward kernel; returns out [B, H, Lq, D] and lse [B, H, Lq]."""
  batch, heads, q_len, head_dim = q.shape
  kv_len = k.shape[2]
  block_q, block_kv = static.blocks.q, static.blocks.kv
  walk = Walk(static, block_q, block_kv, q_len // block_q, kv_len // block_kv)
  prefetch, id_specs, id_args = walk.segment_inputs(q_ids, kv_ids)
  in_specs = [walk.q_spec(head_dim), walk.kv_spec(head_dim),
              walk.kv_spec(head_dim), *id_specs]
  out_specs = [walk.q_spec(head_dim), walk.q_spec(LANES)]
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((batch, heads, q_len, LANES), jnp.float32)]
  itemsize = q.dtype.itemsize
  pairs = batch * heads * q_len * kv_len * walk.work_fraction
  cost = pl.CostEstimate(
      flops=int(4 * pairs * head_dim), transcendentals=int(pairs),
      bytes_accessed=itemsize * (2 * q.size + k.size * walk.num_q * 2))
  out, lse = pl.pallas_call(
      functools.partial(_forward_kernel, walk=walk),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=len(prefetch), grid=walk.grid(batch, heads),
          in_specs=in_specs, out_specs=out_specs,
          scratch_shapes=[pltpu.VMEM((block_q, LANES), jnp.float32),
                          pltpu.VMEM((block_q, LANES), jnp.float32),
                          pltpu.VMEM((block_q, head_dim), jnp.float32)]),
      out_shape=out_shape,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel",
                               "arbitrary")),
      cost_estimate=cost,
      interpret=static.interpret or False,
      name="albert_flash_fwd",
  )(*prefetch, q, k, v, *id_args)
  return out, lse[..., 0]


def interpret_params() -> pltpu.InterpretParams:
  """TPU interpret mode as used on CPU: uninitialised VMEM reads as NaN and
  out-of-bounds reads raise, so kernel bugs surface in tests."""
  return pltpu.InterpretParams(uninitialized_memory="nan",
                               out_of_bounds_reads="raise")
