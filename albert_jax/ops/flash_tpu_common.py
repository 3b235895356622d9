"""Pieces shared by the Pallas TPU flash-attention kernels.

Per-row values (running max, normaliser, log-sum-exp, segment ids) live in
VMEM as [rows, 128] tiles with the value repeated across the 128 lanes, and
per-column values as [8, cols] tiles repeated across the 8 sublanes: both
are whole (8, 128) vreg tiles, so broadcasting them against a [rows, cols]
block is a lane tile or a sublane slice, never a relayout.

`Walk` is what the three kernels share beyond that: how a grid visits
(query block, key block) pairs, which pairs it skips (segment ranges that
cannot meet; under causal masking, key blocks entirely after the query
block), the block specs and segment-id inputs that follow, and the mask
inside a tile.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
from jax import lax
from jax.experimental import pallas as pl
import jax.numpy as jnp

LANES = 128
SUBLANES = 8
# Finite: a masked logit must not make max() or exp() produce inf - inf.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
# Contract the last dimension of both operands: x @ yᵀ without a transpose.
NT_DIMS = (((1,), (1,)), ((), ()))
# x @ y.
NN_DIMS = (((1,), (0,)), ((), ()))


class Static(NamedTuple):
  """Compile-time parameters of one attention call (hashable)."""
  scale: float
  masked: bool  # segment ids or padding can mask pairs
  blocks: Any  # flash_tpu._Blocks
  interpret: Any  # None or pltpu.InterpretParams
  causal: bool = False  # key j attends query i only if j <= i


def matmul(x: jax.Array, y: jax.Array, dims=NN_DIMS) -> jax.Array:
  """x · y on the MXU (`dims` as `lax.dot_general` takes them), in float32.

  16-bit operands are multiplied at their own precision: their products are
  exact in the float32 accumulator, and Mosaic refuses a bfloat16 matmul
  asked for float32 precision (on v4), which a global
  `jax_default_matmul_precision="highest"` would otherwise ask for.
  float32 operands follow the configured default, as XLA's matmuls do.
  """
  precision = lax.Precision.DEFAULT if x.dtype.itemsize == 2 else None
  return lax.dot_general(x, y, dims, precision=precision,
                         preferred_element_type=jnp.float32)


def lanes(x: jax.Array, width: int) -> jax.Array:
  """[rows, LANES] lane-replicated values → [rows, width]."""
  if width == LANES:
    return x
  if width < LANES:
    return x[:, :width]
  return jnp.tile(x, (1, width // LANES))


def lane_layout(x: jax.Array) -> jax.Array:
  """[..., T] → [..., T, LANES]: one row per position, repeated on lanes."""
  return lax.broadcast_in_dim(x, (*x.shape, LANES), tuple(range(x.ndim)))


def sublane_layout(x: jax.Array) -> jax.Array:
  """[B, ..., T] → [B, ..., SUBLANES, T]: positions on lanes."""
  shape = (*x.shape[:-1], SUBLANES, x.shape[-1])
  dims = (*range(x.ndim - 1), x.ndim)
  return lax.broadcast_in_dim(x, shape, dims)


def segment_mask(row_ids: jax.Array, col_ids: jax.Array,
                 num_cols: int) -> jax.Array:
  """Which (row, col) pairs attend: equal ids, and not padding (id 0).

  Args:
    row_ids: [rows, LANES] lane-replicated ids of the block's rows.
    col_ids: [1, num_cols] ids of the block's columns.
    num_cols: width of the block, a multiple of LANES.

  Returns:
    [rows, num_cols] bool.
  """
  rows = jnp.tile(row_ids, (1, num_cols // LANES))
  return (rows == col_ids) & (col_ids != 0)


def block_ranges(ids: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
  """Smallest and largest non-padding id of every block of `block` positions.

  Args:
    ids: [batch, length] int32, length a multiple of `block`.
    block: positions per block.

  Returns:
    (lo, hi), each [batch * length // block] int32 (flat, for SMEM), block
    n of row b at b * (length // block) + n. A block of padding only gets
    lo > hi, so it meets nothing.
  """
  batch, length = ids.shape
  blocks = ids.reshape(batch, length // block, block)
  valid = blocks != 0
  info = jnp.iinfo(jnp.int32)
  lo = jnp.min(jnp.where(valid, blocks, info.max), axis=-1)
  hi = jnp.max(jnp.where(valid, blocks, info.min), axis=-1)
  return lo.reshape(-1), hi.reshape(-1)


def blocks_meet(q_lo, q_hi, kv_lo, kv_hi, q_index, kv_index) -> jax.Array:
  """Whether a query block and a key block can share a segment id.

  Equal ids need overlapping [lo, hi] ranges, so disjoint ranges prove the
  whole [block_q, block_kv] tile masked; overlapping ones are computed.
  The refs are the SMEM-prefetched outputs of `block_ranges`.
  """
  return ((q_lo[q_index] <= kv_hi[kv_index])
          & (kv_lo[kv_index] <= q_hi[q_index]))


class Refs(NamedTuple):
  """A kernel's refs, split: SMEM block ranges (when masked), its main
  inputs, the segment-id tiles (when masked), then outputs and scratch."""
  ranges: tuple | None  # (q_lo, q_hi, kv_lo, kv_hi)
  inputs: tuple
  q_ids: Any
  kv_ids: Any
  rest: tuple


@dataclasses.dataclass(frozen=True)
class Walk:
  """How one kernel's grid walks the (query block, key block) pairs.

  The grid is (batch, head, outer, inner): `outer` indexes the blocks the
  kernel writes (query blocks for the forward and dq kernels, key blocks for
  dk/dv, `keys_outer`), `inner` the reduction over the other sequence.

  Attributes:
    static: the call's compile-time parameters.
    block_q, block_kv: tile sizes along the query and key sequences.
    num_q, num_kv: blocks along each (padded) sequence.
    keys_outer: the dk/dv orientation: keys on the tiles' rows.
  """
  static: Static
  block_q: int
  block_kv: int
  num_q: int
  num_kv: int
  keys_outer: bool = False

  def grid(self, batch: int, heads: int) -> tuple[int, int, int, int]:
    if self.keys_outer:
      return batch, heads, self.num_kv, self.num_q
    return batch, heads, self.num_q, self.num_kv

  @property
  def work_fraction(self) -> float:
    """Share of the block pairs computed, for cost estimates: causal
    masking skips about half of them."""
    return 0.5 if self.static.causal else 1.0

  def pair(self, outer, inner):
    """(query block, key block) of a grid step."""
    return (inner, outer) if self.keys_outer else (outer, inner)

  def fetched(self, outer, inner):
    """(query block, key block) whose tiles a grid step reads.

    Under causal masking the steps whose key block lies entirely after the
    query block compute nothing; they name the nearest block that is
    computed instead, and the pipeline does not copy a block again when
    consecutive steps name the same one, so skipped steps cost no DMA.
    """
    i, j = self.pair(outer, inner)
    if not self.static.causal:
      return i, j
    # lax.div truncates, which is floor division for these non-negative
    # indices; `//` would also emit sign fix-ups for negative operands.
    if self.keys_outer:  # skipped: the leading query blocks
      first = lax.div(j * self.block_kv, jnp.int32(self.block_q))
      return jnp.minimum(jnp.maximum(i, first), self.num_q - 1), j
    last = lax.div((i + 1) * self.block_q - 1, jnp.int32(self.block_kv))
    return i, jnp.minimum(j, last)

  def q_spec(self, width: int) -> pl.BlockSpec:
    """[B, H, Lq, width] → one query block of one head."""
    def index(b, h, outer, inner, *_):
      return b, h, self.fetched(outer, inner)[0], 0
    return pl.BlockSpec((None, None, self.block_q, width), index)

  def kv_spec(self, width: int) -> pl.BlockSpec:
    """[B, H, Lk, width] → one key block of one head."""
    def index(b, h, outer, inner, *_):
      return b, h, self.fetched(outer, inner)[1], 0
    return pl.BlockSpec((None, None, self.block_kv, width), index)

  def q_columns_spec(self) -> pl.BlockSpec:
    """[B, H, SUBLANES, Lq] per-query values with queries on lanes."""
    def index(b, h, outer, inner, *_):
      return b, h, 0, self.fetched(outer, inner)[0]
    return pl.BlockSpec((None, None, SUBLANES, self.block_q), index)

  def segment_inputs(self, q_ids: jax.Array, kv_ids: jax.Array
                     ) -> tuple[list, list, list]:
    """(scalar prefetch, in_specs, args) for the segment ids, all empty
    without a segment mask. The tiles' rows get lane-replicated ids, their
    columns sublane-replicated ones (see `segment_mask`).

    Args:
      q_ids: [batch, q_len] int32, padded.
      kv_ids: [batch, kv_len] int32, padded.
    """
    if not self.static.masked:
      return [], [], []

    def rows_spec(block, which):  # [B, L, LANES]
      def index(b, h, outer, inner, *_):
        return b, self.fetched(outer, inner)[which], 0
      return pl.BlockSpec((None, block, LANES), index)

    def cols_spec(block, which):  # [B, SUBLANES, L]
      def index(b, h, outer, inner, *_):
        return b, 0, self.fetched(outer, inner)[which]
      return pl.BlockSpec((None, SUBLANES, block), index)

    prefetch = [*block_ranges(q_ids, self.block_q),
                *block_ranges(kv_ids, self.block_kv)]
    if self.keys_outer:
      specs = [cols_spec(self.block_q, 0), rows_spec(self.block_kv, 1)]
      args = [sublane_layout(q_ids), lane_layout(kv_ids)]
    else:
      specs = [rows_spec(self.block_q, 0), cols_spec(self.block_kv, 1)]
      args = [lane_layout(q_ids), sublane_layout(kv_ids)]
    return prefetch, specs, args

  def refs(self, refs: tuple, num_inputs: int) -> Refs:
    """Splits a kernel's refs laid out as `segment_inputs` puts them."""
    if not self.static.masked:
      return Refs(None, refs[:num_inputs], None, None, refs[num_inputs:])
    inputs = refs[4:4 + num_inputs]
    q_ids, kv_ids = refs[4 + num_inputs:6 + num_inputs]
    return Refs(refs[:4], inputs, q_ids, kv_ids, refs[6 + num_inputs:])

  def run(self, step, refs: Refs, b, outer, inner) -> None:
    """Runs `step()` unless the grid step's tile is known to be masked."""
    i, j = self.pair(outer, inner)
    runs = None
    if self.static.masked:
      q_lo, q_hi, kv_lo, kv_hi = refs.ranges
      runs = blocks_meet(q_lo, q_hi, kv_lo, kv_hi, b * self.num_q + i,
                         b * self.num_kv + j)
    if self.static.causal:
      # The block's first key comes after its last query: all masked.
      before = j * self.block_kv <= (i + 1) * self.block_q - 1
      runs = before if runs is None else runs & before
    if runs is None:
      step()
    else:
      pl.when(runs)(step)

  def tile_mask(self, refs: Refs, outer, inner, shape: tuple[int, int]
                ) -> jax.Array | None:
    """[rows, cols] bool: the tile's pairs that attend; None if all do.

    Rows are queries and columns keys, or the reverse with `keys_outer`.
    """
    mask = None
    if self.static.masked:
      if self.keys_outer:
        mask = segment_mask(refs.kv_ids[...], refs.q_ids[:1, :], shape[1])
      else:
        mask = segment_mask(refs.q_ids[...], refs.kv_ids[:1, :], shape[1])
    if self.static.causal:
      i, j = self.pair(outer, inner)
      rows = lax.broadcasted_iota(jnp.int32, shape, 0)
      cols = lax.broadcasted_iota(jnp.int32, shape, 1)
      if self.keys_outer:
        keep = j * self.block_kv + rows <= i * self.block_q + cols
      else:
        keep = j * self.block_kv + cols <= i * self.block_q + rows
      mask = keep if mask is None else mask & keep
    return mask
