"""The Mosaic GPU flash-attention kernels.

JAX 0.10.2's GPU interpret mode cannot run them (no `pl.run_state`, no
transposed or register WGMMA operands; see `albert_jax.ops.flash_gpu`), so
without a GPU these tests lower forward and backward for CUDA: Pallas to
Mosaic GPU, including Mosaic's layout inference and dialect lowering for
sm_90, which is where shape, layout and pipeline mistakes surface. The
numerical tests against the XLA path need a Hopper GPU and are skipped
elsewhere.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax.ops import attention
from albert_jax.ops import flash_gpu


def _has_hopper():
  if jax.default_backend() != "gpu":
    return False
  return str(getattr(jax.devices()[0], "compute_capability", "")).startswith(
      "9.")


needs_hopper = pytest.mark.skipif(
    not _has_hopper(),
    reason="runs the Mosaic GPU kernels: needs a Hopper (sm_90) GPU")


def _loss(q, k, v, ids):
  out = flash_gpu.flash_attention(q, k, v, ids)
  return jnp.sum(out.astype(jnp.float32) ** 2)


@pytest.mark.parametrize("head_dim, masked", [(64, True), (128, False)])
def test_forward_and_backward_lower_for_cuda(head_dim, masked):
  q = jax.ShapeDtypeStruct((2, 384, 2, head_dim), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((2, 384), jnp.int32) if masked else None
  grad = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1, 2)))
  text = grad.trace(q, q, q, ids).lower(
      lowering_platforms=("cuda",)).as_text()
  # One custom call each: forward, dq, dk/dv.
  assert text.count("stablehlo.custom_call @mosaic_gpu") == 3


def test_block_sizes_and_padding_multiple():
  sizes = flash_gpu.BlockSizes()
  assert sizes.padding_multiple() == 128
  assert flash_gpu.BlockSizes(block_q=128, block_kv=64).padding_multiple() == (
      256)
  with pytest.raises(ValueError, match="BlockSizes.block_kv=96"):
    flash_gpu.BlockSizes(block_kv=96)
  with pytest.raises(ValueError, match="max_concurrent_steps"):
    flash_gpu.BlockSizes(max_concurrent_steps=0)


def test_refuses_unsupported_inputs():
  q = jnp.zeros((1, 8, 1, 96), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"Head_dim 96 .* \(64, 128\)"):
    flash_gpu.flash_attention(q, q, q)
  q = jnp.zeros((1, 8, 1, 64), jnp.float32)
  with pytest.raises(ValueError, match="all bfloat16 or all float16"):
    flash_gpu.flash_attention(q, q, q)
  choose = attention._choose  # pylint: disable=protected-access
  bf16 = [jnp.zeros((1, 8, 2, 64), jnp.bfloat16)] * 3
  assert choose("pallas", *bf16, False, "gpu") == "pallas"
  with pytest.raises(ValueError, match="impl='pallas' on gpu: the Mosaic"):
    choose("pallas", q, q, q, False, "gpu")


def _inputs(seed, batch, length, heads, head_dim, scale=1.0):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)) * s,
                      jnp.bfloat16) for s in (scale, scale, 1.0, 1.0)]


def _rel_err(actual, expected):
  actual = np.asarray(actual, np.float32)
  expected = np.asarray(expected, np.float32)
  assert np.all(np.isfinite(actual))
  return np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-2)


@needs_hopper
@pytest.mark.parametrize("length, head_dim, kind", [
    (128, 64, "none"), (300, 64, "packed"), (512, 128, "padded"),
    (1000, 64, "random")])
def test_matches_xla_on_gpu(length, head_dim, kind):
  q, k, v, cotangent = _inputs(0, 2, length, 2, head_dim, scale=1.5)
  rng = np.random.default_rng(1)
  if kind == "none":
    ids = None
  elif kind == "packed":
    ids = np.repeat(np.asarray([[1, 2, 3, 0]]), [100, 120, 50, 30], axis=1)
    ids = np.concatenate([ids, np.zeros_like(ids)])  # row 1: padding only
  elif kind == "padded":
    ids = (np.arange(length)[None] < np.asarray([[400], [37]])).astype(int)
  else:
    ids = rng.integers(0, 4, size=(2, length))
  ids = None if ids is None else jnp.asarray(ids, jnp.int32)

  def run(impl, q, k, v, cotangent):
    def attend(q, k, v):
      if impl == "pallas":
        return flash_gpu.flash_attention(q, k, v, ids)
      return attention.dot_product_attention(q, k, v, segment_ids=ids,
                                             impl="xla")
    out, vjp = jax.vjp(attend, q, k, v)
    return (out, *vjp(cotangent.astype(out.dtype)))

  got = jax.jit(lambda *a: run("pallas", *a))(q, k, v, cotangent)
  f32 = [t.astype(jnp.float32) for t in (q, k, v, cotangent)]
  want = jax.jit(lambda *a: run("xla", *a))(*f32)
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    assert g.dtype == jnp.bfloat16, name
    assert _rel_err(g, w) <= 2e-2, name
  if kind == "packed":
    for t in got:
      np.testing.assert_array_equal(np.asarray(t, np.float32)[1], 0.0)


@needs_hopper
def test_entry_point_runs_the_gpu_kernel():
  q, k, v, _ = _inputs(2, 1, 256, 2, 64)
  ids = jnp.asarray(np.repeat([[1, 0]], [200, 56], axis=1), jnp.int32)
  got = attention.dot_product_attention(q, k, v, segment_ids=ids,
                                        impl="pallas")
  want = flash_gpu.flash_attention(q, k, v, ids)
  np.testing.assert_array_equal(np.asarray(got, np.float32),
                                np.asarray(want, np.float32))


@needs_hopper
@pytest.mark.parametrize("impl", ["cudnn", "pallas"])
def test_right_padded_rows_on_the_gpu_match_xla(impl):
  """On a GPU: attention over right-padded rows with row lengths (cuDNN's
  padding mask) or segment ids (the kernel) gives XLA's values and
  gradients, and exact zeros on padded query rows, whose gradients are
  zero too (the model's padded rows must stay finite: 0 · NaN in a weight
  gradient would poison the step)."""
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.normal(size=(3, 256, 4, 64)), jnp.bfloat16)
             for _ in range(3))
  lengths = np.asarray([256, 200, 7])
  ids = jnp.asarray(np.arange(256)[None] < lengths[:, None], jnp.int32)

  def run(impl_, right_padded):
    def loss(q, k, v):
      out = attention.dot_product_attention(
          q, k, v, segment_ids=ids, impl=impl_, right_padded=right_padded,
          deterministic=False)
      return jnp.sum(out.astype(jnp.float32) ** 2), out
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2),
                                      has_aux=True))(q, k, v)

  (value, out), grads = run(impl, True)
  (value_ref, out_ref), grads_ref = run("xla", False)
  out = np.asarray(out, np.float32)
  assert np.all(out[1, 200:] == 0) and np.all(out[2, 7:] == 0)
  np.testing.assert_allclose(out, np.asarray(out_ref, np.float32),
                             atol=2e-2, rtol=2e-2)
  np.testing.assert_allclose(value, value_ref, rtol=2e-2)
  for got, want in zip(grads, grads_ref):
    got = np.asarray(got, np.float32)
    assert np.all(np.isfinite(got)) and np.all(got[2, 7:] == 0)
    np.testing.assert_allclose(got, np.asarray(want, np.float32),
                               atol=5e-2, rtol=5e-2)
