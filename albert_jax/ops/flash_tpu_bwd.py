"""Backward kernels of the Pallas TPU flash attention: dq, then dk and dv.

Both recompute the probabilities from the saved log-sum-exp instead of
storing them: P = exp(s - lse), masked to exactly 0 off-segment, and
dS = P ∘ (dO vᵀ - di) with di = rowsum(dO ∘ O). dq sums dS k over key
blocks; dk and dv sum dSᵀ q and Pᵀ dO over query blocks. Splitting them
keeps each accumulator in VMEM scratch for a whole reduction and needs no
atomics: every output block is owned by one grid step sequence. Under causal
masking both skip the block pairs the forward skips, keys entirely after
the queries (see `flash_tpu_common.Walk`).
"""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp

from albert_jax.ops.flash_tpu_common import lane_layout
from albert_jax.ops.flash_tpu_common import LANES
from albert_jax.ops.flash_tpu_common import lanes
from albert_jax.ops.flash_tpu_common import matmul
from albert_jax.ops.flash_tpu_common import NT_DIMS
from albert_jax.ops.flash_tpu_common import Static
from albert_jax.ops.flash_tpu_common import sublane_layout
from albert_jax.ops.flash_tpu_common import Walk

_SEMANTICS = ("parallel", "parallel", "parallel", "arbitrary")


def _dq_kernel(*refs, walk: Walk):
  """Grid (batch, head, q block, kv block): dq of one q block."""
  r = walk.refs(refs, 6)
  q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref = r.inputs
  dq_ref, acc = r.rest
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    acc[...] = jnp.zeros(acc.shape, jnp.float32)

  def step():
    k = k_ref[...]
    s = matmul(q_ref[...], k, NT_DIMS) * walk.static.scale
    block_kv = s.shape[1]
    p = jnp.exp(s - lanes(lse_ref[...], block_kv))
    mask = walk.tile_mask(r, i, j, s.shape)
    if mask is not None:
      p = jnp.where(mask, p, 0.0)
    dp = matmul(do_ref[...], v_ref[...], NT_DIMS)
    ds = p * (dp - lanes(di_ref[...], block_kv))
    acc[...] += matmul(ds.astype(k.dtype), k)

  walk.run(step, r, b, i, j)

  @pl.when(j == walk.num_kv - 1)
  def _finish():
    dq_ref[...] = (acc[...] * walk.static.scale).astype(dq_ref.dtype)


def dq(q, k, v, q_ids, kv_ids, d_out, lse, di, static: Static) -> jax.Array:
  """Gradient wrt q.

  Args:
    q: [batch, heads, q_len, head_dim] (kernel layout, padded).
    k: [batch, heads, kv_len, head_dim].
    v: [batch, heads, kv_len, head_dim].
    q_ids: [batch, q_len] int32, 0 = padding.
    kv_ids: [batch, kv_len] int32.
    d_out: [batch, heads, q_len, head_dim], cotangent of the output.
    lse: [batch, heads, q_len] float32 log-sum-exp from the forward.
    di: [batch, heads, q_len] float32, rowsum(d_out ∘ out).
    static: the call's compile-time parameters.

  Returns:
    [batch, heads, q_len, head_dim] in q's dtype.
  """
  batch, heads, q_len, head_dim = q.shape
  kv_len = k.shape[2]
  block_q, block_kv = static.blocks.q_dq, static.blocks.kv_dq
  walk = Walk(static, block_q, block_kv, q_len // block_q, kv_len // block_kv)
  prefetch, id_specs, id_args = walk.segment_inputs(q_ids, kv_ids)
  q_spec, kv_spec, row_spec = (walk.q_spec(head_dim), walk.kv_spec(head_dim),
                               walk.q_spec(LANES))
  in_specs = [q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec, *id_specs]
  args = [q, k, v, d_out, lane_layout(lse), lane_layout(di), *id_args]
  pairs = batch * heads * q_len * kv_len * walk.work_fraction
  cost = pl.CostEstimate(
      flops=int(6 * pairs * head_dim), transcendentals=int(pairs),
      bytes_accessed=q.dtype.itemsize * (3 * q.size + 2 * k.size * walk.num_q))
  return pl.pallas_call(
      functools.partial(_dq_kernel, walk=walk),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=len(prefetch), grid=walk.grid(batch, heads),
          in_specs=in_specs, out_specs=q_spec,
          scratch_shapes=[pltpu.VMEM((block_q, head_dim), jnp.float32)]),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=pltpu.CompilerParams(dimension_semantics=_SEMANTICS),
      cost_estimate=cost,
      interpret=static.interpret or False,
      name="albert_flash_bwd_dq",
  )(*prefetch, *args)


def _dkv_kernel(*refs, walk: Walk):
  """Grid (batch, head, kv block, q block): dk, dv of one kv block.

  Works on the transposed scores sᵀ = k qᵀ [block_kv, block_q] so that
  Pᵀ dO and dSᵀ q are plain matmuls; per-query values come in sublane
  layout [SUBLANES, block_q] and broadcast down the rows.
  """
  r = walk.refs(refs, 6)
  q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref = r.inputs
  dk_ref, dv_ref, dk_acc, dv_acc = r.rest
  b, j, i = pl.program_id(0), pl.program_id(2), pl.program_id(3)

  @pl.when(i == 0)
  def _init():
    dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
    dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

  def step():
    q = q_ref[...]
    do = do_ref[...]
    st = matmul(k_ref[...], q, NT_DIMS) * walk.static.scale
    pt = jnp.exp(st - lse_ref[:1, :])
    mask = walk.tile_mask(r, j, i, st.shape)
    if mask is not None:
      pt = jnp.where(mask, pt, 0.0)
    dv_acc[...] += matmul(pt.astype(do.dtype), do)
    dpt = matmul(v_ref[...], do, NT_DIMS)
    dst = pt * (dpt - di_ref[:1, :])
    dk_acc[...] += matmul(dst.astype(q.dtype), q)

  walk.run(step, r, b, j, i)

  @pl.when(i == walk.num_q - 1)
  def _finish():
    dk_ref[...] = (dk_acc[...] * walk.static.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def dkv(q, k, v, q_ids, kv_ids, d_out, lse, di,
        static: Static) -> tuple[jax.Array, jax.Array]:
  """Gradients wrt k and v; arguments as for `dq`.

  Returns:
    (dk, dv), each [batch, heads, kv_len, head_dim] in k's dtype.
  """
  batch, heads, q_len, head_dim = q.shape
  kv_len = k.shape[2]
  block_q, block_kv = static.blocks.q_dkv, static.blocks.kv_dkv
  walk = Walk(static, block_q, block_kv, q_len // block_q, kv_len // block_kv,
              keys_outer=True)
  prefetch, id_specs, id_args = walk.segment_inputs(q_ids, kv_ids)
  q_spec, kv_spec, col_spec = (walk.q_spec(head_dim), walk.kv_spec(head_dim),
                               walk.q_columns_spec())
  in_specs = [q_spec, kv_spec, kv_spec, q_spec, col_spec, col_spec, *id_specs]
  args = [q, k, v, d_out, sublane_layout(lse), sublane_layout(di), *id_args]
  pairs = batch * heads * q_len * kv_len * walk.work_fraction
  cost = pl.CostEstimate(
      flops=int(8 * pairs * head_dim), transcendentals=int(pairs),
      bytes_accessed=q.dtype.itemsize * (2 * q.size * walk.num_kv
                                         + 4 * k.size))
  return pl.pallas_call(
      functools.partial(_dkv_kernel, walk=walk),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=len(prefetch), grid=walk.grid(batch, heads),
          in_specs=in_specs, out_specs=[kv_spec, kv_spec],
          scratch_shapes=[pltpu.VMEM((block_kv, head_dim), jnp.float32),
                          pltpu.VMEM((block_kv, head_dim), jnp.float32)]),
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                 jax.ShapeDtypeStruct(v.shape, v.dtype)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=_SEMANTICS),
      cost_estimate=cost,
      interpret=static.interpret or False,
      name="albert_flash_bwd_dkv",
  )(*prefetch, *args)
