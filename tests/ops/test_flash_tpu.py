"""The Pallas TPU flash-attention kernels against the XLA reference.

On CPU the kernels run in TPU interpret mode, which simulates VMEM, the grid
and the block DMAs (uninitialised memory reads as NaN), so these tests check
the real kernels, only slowly: shapes stay small and the block size is 128
so that grids still have several steps along both sequences.

Errors are measured per tensor as max|actual - expected| / max|expected|,
the denominator floored at 1e-2: a gradient that is zero in exact arithmetic
(one key per query makes dq and dk vanish) is then held to an absolute
bound instead of comparing rounding noise with rounding noise.
"""

import logging

import flax.linen as nn
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax.model.albert import Albert
from albert_jax.model.config import ModelConfig
from albert_jax.ops import attention
from albert_jax.ops import flash_tpu

# No shrinking: every example compiles the kernels anew, so shrinking a
# failure would take minutes; the failing example is printed as drawn.
FEW = hypothesis.settings(
    max_examples=3, deadline=None, derandomize=True, database=None,
    phases=(hypothesis.Phase.explicit, hypothesis.Phase.generate))
SMALL_BLOCKS = flash_tpu.BlockSizes(128, 128, 128, 128, 128, 128)


def _attend_and_grads(q, k, v, q_ids, kv_ids, cotangent, *, impl,
                      block_sizes=None, causal=False):
  """Output and (dq, dk, dv) of sum(out * cotangent)."""

  def attend(q, k, v):
    if impl == "kernel":  # the kernel's own API, with its block sizes
      return flash_tpu.flash_attention(
          q, k, v, q_ids, kv_ids, block_sizes=block_sizes,
          interpret=flash_tpu.interpret_params(), causal=causal)
    return attention.dot_product_attention(
        q, k, v, segment_ids=q_ids, kv_segment_ids=kv_ids, impl=impl,
        causal=causal)

  out, vjp = jax.vjp(attend, q, k, v)
  return (out, *vjp(cotangent.astype(out.dtype)))


# Interpret mode turns each kernel into a loop of callbacks; XLA's CPU
# optimisations cost far more compile time than they save at these sizes.
FAST_COMPILE = {"xla_backend_optimization_level": 0,
                "xla_cpu_use_fusion_emitters": False,
                "xla_llvm_disable_expensive_passes": True}
run = jax.jit(_attend_and_grads,
              static_argnames=("impl", "block_sizes", "causal"),
              compiler_options=FAST_COMPILE)


def _inputs(seed, batch, q_len, kv_len, heads, head_dim, dtype=jnp.float32,
            scale=1.0):
  rng = np.random.default_rng(seed)

  def normal(length, s=1.0):
    return jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)) * s,
                       dtype)

  return (normal(q_len, scale), normal(kv_len, scale), normal(kv_len),
          normal(q_len))


def _rel_err(actual, expected):
  actual = np.asarray(actual, np.float32)
  expected = np.asarray(expected, np.float32)
  assert np.all(np.isfinite(actual))
  return np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-2)


def _check_parity(q, k, v, q_ids, kv_ids, cotangent, out_tol, grad_tol,
                  **kernel_kwargs):
  """Kernel output and gradients against the XLA path on the same inputs."""
  q_ids = None if q_ids is None else jnp.asarray(q_ids, jnp.int32)
  kv_ids = None if kv_ids is None else jnp.asarray(kv_ids, jnp.int32)
  got = run(q, k, v, q_ids, kv_ids, cotangent, **kernel_kwargs)
  f32 = [t.astype(jnp.float32) for t in (q, k, v, cotangent)]
  want = run(*f32[:3], q_ids, kv_ids, f32[3], impl="xla",
             causal=kernel_kwargs.get("causal", False))
  assert got[0].shape == q.shape and got[0].dtype == q.dtype
  for name, g in zip(("dq", "dk", "dv"), got[1:]):
    assert g.dtype == q.dtype, name
  assert _rel_err(got[0], want[0]) <= out_tol
  for name, g, w in zip(("dq", "dk", "dv"), got[1:], want[1:]):
    assert _rel_err(g, w) <= grad_tol, name
  return got


def _packed_ids(rng, batch, length, max_segments):
  """Rows of consecutive segments 1, 2, ... of random lengths, then padding
  (a row may be padding only)."""
  ids = np.zeros((batch, length), np.int32)
  for b in range(batch):
    cuts = np.sort(rng.integers(0, length + 1, size=max_segments))
    start = 0
    for segment, end in enumerate(cuts, start=1):
      ids[b, start:end] = segment
      start = end
  return ids


# Hand-picked cases so that every kernel path runs whatever hypothesis draws.
CASES = {
    # No ids and whole blocks: the kernels' mask-free variant, 2 x 2 grid.
    "unmasked": dict(batch=1, q_len=256, kv_len=256, heads=2, head_dim=64,
                     ids="none"),
    # Padded to 256 inside; row 1 is all padding.
    "padded": dict(batch=2, q_len=200, kv_len=200, heads=1, head_dim=64,
                   ids=np.asarray([[1] * 130 + [0] * 70, [0] * 200])),
    # Three packed sequences: segment 1 and 3 share no block, so that block
    # pair is skipped; head_dim 128.
    "packed": dict(batch=1, q_len=300, kv_len=300, heads=1, head_dim=128,
                   ids=np.asarray([[1] * 100 + [2] * 120 + [3] * 50
                                   + [0] * 30])),
    # Cross attention with separate ids; query id 3 has no key at all.
    "cross": dict(batch=1, q_len=70, kv_len=150, heads=2, head_dim=64,
                  ids=(np.asarray([[1] * 30 + [3] * 10 + [2] * 20 + [0] * 10]),
                       np.asarray([[2] * 50 + [1] * 80 + [0] * 20]))),
}


def _case_ids(ids):
  if isinstance(ids, str):
    return None, None
  if isinstance(ids, tuple):
    return ids
  return ids, ids


@pytest.mark.parametrize("name", list(CASES))
def test_float32_matches_xla(name):
  case = CASES[name]
  q, k, v, cotangent = _inputs(0, case["batch"], case["q_len"],
                               case["kv_len"], case["heads"],
                               case["head_dim"], scale=1.5)
  q_ids, kv_ids = _case_ids(case["ids"])
  _check_parity(q, k, v, q_ids, kv_ids, cotangent, 1e-5, 1e-4,
                impl="kernel", block_sizes=SMALL_BLOCKS)


@FEW
@hypothesis.given(batch=st.integers(1, 2), q_len=st.integers(1, 300),
                  kv_len=st.one_of(st.none(), st.integers(1, 200)),
                  head_dim=st.sampled_from([64, 128]),
                  kind=st.sampled_from(["none", "packed", "random"]),
                  block=st.sampled_from([128, 256]),
                  seed=st.integers(0, 2**16))
def test_random_shapes_match_xla(batch, q_len, kv_len, head_dim, kind, block,
                                 seed):
  kv_len = q_len if kv_len is None else kv_len
  rng = np.random.default_rng(seed)
  q, k, v, cotangent = _inputs(seed, batch, q_len, kv_len, 1, head_dim,
                               scale=1.5)
  if kind == "none":
    q_ids = kv_ids = None
  elif kind == "packed":
    q_ids = _packed_ids(rng, batch, q_len, 3)
    kv_ids = _packed_ids(rng, batch, kv_len, 3)
  else:  # ids anywhere, padding anywhere
    q_ids = rng.integers(0, 4, size=(batch, q_len))
    kv_ids = rng.integers(0, 4, size=(batch, kv_len))
  sizes = flash_tpu.BlockSizes(block, 128, 128, block, block, 128)
  _check_parity(q, k, v, q_ids, kv_ids, cotangent, 1e-5, 1e-4,
                impl="kernel", block_sizes=sizes)


def test_bfloat16_close_to_float32_reference():
  case = CASES["padded"]
  q, k, v, cotangent = _inputs(1, case["batch"], case["q_len"],
                               case["kv_len"], case["heads"],
                               case["head_dim"], dtype=jnp.bfloat16)
  _check_parity(q, k, v, case["ids"], case["ids"], cotangent, 2e-2, 2e-2,
                impl="kernel", block_sizes=SMALL_BLOCKS)


def test_rows_without_keys_are_zeros_never_nan():
  """Huge logits, an all-padding row and a query id no key carries: those
  rows are exact zeros in the output and in every gradient."""
  case = CASES["cross"]
  q, k, v, cotangent = _inputs(2, case["batch"], case["q_len"],
                               case["kv_len"], case["heads"],
                               case["head_dim"], scale=30.0)
  q_ids, kv_ids = (jnp.asarray(i, jnp.int32) for i in case["ids"])
  out, dq, dk, dv = (np.asarray(t) for t in run(
      q, k, v, q_ids, kv_ids, cotangent, impl="kernel",
      block_sizes=SMALL_BLOCKS))
  for t in (out, dq, dk, dv):
    assert np.all(np.isfinite(t))
  no_key = np.asarray(case["ids"][0][0] == 3) | (case["ids"][0][0] == 0)
  np.testing.assert_array_equal(out[0, no_key], 0.0)
  np.testing.assert_array_equal(dq[0, no_key], 0.0)
  assert np.abs(out[0, ~no_key]).min() > 0
  kv_padding = case["ids"][1][0] == 0
  np.testing.assert_array_equal(dk[0, kv_padding], 0.0)
  np.testing.assert_array_equal(dv[0, kv_padding], 0.0)
  # The all-padding batch row of the padded case, through the entry point.
  case = CASES["padded"]
  q, k, v, cotangent = _inputs(3, case["batch"], case["q_len"],
                               case["kv_len"], case["heads"],
                               case["head_dim"], scale=30.0)
  got = run(q, k, v, jnp.asarray(case["ids"]), None, cotangent,
            impl="pallas")
  for t in got:
    t = np.asarray(t)
    assert np.all(np.isfinite(t))
    np.testing.assert_array_equal(t[1], 0.0)
    np.testing.assert_array_equal(t[0, 130:], 0.0)


def test_entry_point_pallas_matches_xla_with_default_blocks():
  case = CASES["packed"]
  q, k, v, cotangent = _inputs(4, case["batch"], case["q_len"],
                               case["kv_len"], case["heads"],
                               case["head_dim"], scale=1.5)
  _check_parity(q, k, v, case["ids"], case["ids"], cotangent, 1e-5, 1e-4,
                impl="pallas")


def test_dropout_falls_back_to_xla_and_logs_once(caplog):
  """Active dropout runs the xla path bit for bit, whatever impl says; the
  reason is logged once even though every new shape traces again."""
  q, k, v, _ = _inputs(5, 1, 8, 8, 1, 64)
  ids = jnp.asarray([[1, 1, 1, 2, 2, 2, 0, 0]])
  attention._log_once.cache_clear()  # pylint: disable=protected-access
  attend = jax.jit(attention.dot_product_attention,
                   static_argnames=("dropout_rate", "deterministic", "impl"),
                   compiler_options=FAST_COMPILE)
  key = jax.random.PRNGKey(7)
  with caplog.at_level(logging.WARNING, logger=attention.__name__):
    for length in (8, 6):  # two traces
      args = (q[:, :length], k[:, :length], v[:, :length])
      kwargs = dict(segment_ids=ids[:, :length], dropout_rate=0.3,
                    dropout_rng=key, deterministic=False)
      want = attend(*args, impl="xla", **kwargs)
      np.testing.assert_array_equal(attend(*args, impl="pallas", **kwargs),
                                    want)
  messages = [r.getMessage() for r in caplog.records]
  assert len(messages) == 1, messages
  assert "pallas kernel has no attention dropout" in messages[0]


def test_auto_resolution_per_backend(caplog):
  """auto: the TPU kernel on TPU, on GPU the faster of the Mosaic GPU
  kernel and cuDNN by the measured table (the kernel for short rows), xla
  on CPU; each only where it takes the inputs, else xla with the reason
  logged once."""
  choose = attention._choose  # pylint: disable=protected-access
  attention._log_once.cache_clear()  # pylint: disable=protected-access
  f32 = [jnp.zeros((1, 8, 2, 64), jnp.float32)] * 3
  bf16 = [t.astype(jnp.bfloat16) for t in f32]
  odd = [jnp.zeros((1, 8, 2, 48), jnp.bfloat16)] * 3
  assert choose("auto", *f32, False, "cpu") == "xla"
  assert choose("auto", *f32, False, "tpu") == "pallas"
  assert choose("auto", *bf16, False, "gpu") == "pallas"
  assert choose("auto", *bf16, False, "gpu", causal=True) == "cudnn"
  assert choose("pallas", *f32, False, "cpu") == "pallas"
  assert choose("xla", *bf16, False, "tpu") == "xla"
  with caplog.at_level(logging.WARNING, logger=attention.__name__):
    assert choose("auto", *odd, False, "tpu") == "xla"
    assert choose("auto", *f32, False, "gpu") == "xla"
    assert choose("auto", *bf16, True, "tpu") == "xla"
    assert choose("auto", *odd, False, "tpu") == "xla"  # logged already
  text = "\n".join(r.getMessage() for r in caplog.records)
  assert len(caplog.records) == 3, text
  assert "head_dim 48" in text and "float16/bfloat16, not float32" in text
  assert "no attention dropout" in text
  with pytest.raises(ValueError, match="no kernel for the 'METAL' backend"):
    choose("pallas", *f32, False, "METAL")


# Causal masking: the kernels skip key blocks entirely after the query block
# (and do not fetch them); the tile on the diagonal is masked inside.
CAUSAL_CASES = {
    # Padding, three packed sequences and a row with a padded middle,
    # square 128 blocks (3 x 3 pairs, 3 skipped).
    "packed": dict(batch=2, q_len=300, kv_len=300, ids=np.asarray(
        [[1] * 100 + [2] * 120 + [3] * 50 + [0] * 30,
         [1] * 60 + [0] * 40 + [1] * 150 + [2] * 50]), sizes=SMALL_BLOCKS),
    # No ids and whole blocks (causal is the only mask); query blocks of 256
    # against key blocks of 128 and the reverse.
    "uneven": dict(batch=1, q_len=512, kv_len=512, ids=None,
                   sizes=flash_tpu.BlockSizes(256, 128, 128, 256, 256, 128)),
}


@pytest.mark.parametrize("name", list(CAUSAL_CASES))
def test_causal_float32_matches_xla(name):
  case = CAUSAL_CASES[name]
  q, k, v, cotangent = _inputs(6, case["batch"], case["q_len"],
                               case["kv_len"], 1, 64, scale=1.5)
  _check_parity(q, k, v, case["ids"], case["ids"], cotangent, 1e-5, 1e-4,
                impl="kernel", block_sizes=case["sizes"], causal=True)


def test_causal_bfloat16_close_to_float32_reference():
  ids = CAUSAL_CASES["packed"]["ids"][:1]  # the packed and padded row
  q, k, v, cotangent = _inputs(7, 1, 300, 300, 1, 64, dtype=jnp.bfloat16)
  _check_parity(q, k, v, ids, ids, cotangent, 2e-2, 2e-2, impl="kernel",
                block_sizes=SMALL_BLOCKS, causal=True)


def test_causal_padding_rows_are_zeros_through_the_entry_point():
  """impl="pallas", causal: an all-padding row and padding positions are
  exact zeros in the output and every gradient, never NaN."""
  ids = np.asarray([[0] * 200, [1] * 90 + [2] * 70 + [0] * 40])
  q, k, v, cotangent = _inputs(8, 2, 200, 200, 1, 64, scale=30.0)
  got = run(q, k, v, jnp.asarray(ids), None, cotangent, impl="pallas",
            causal=True)
  for g in got:
    g = np.asarray(g)
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(g[0], 0.0)
    np.testing.assert_array_equal(g[1, 160:], 0.0)
  assert np.abs(np.asarray(got[0][1, :160])).min() > 0


def test_causal_kernels_skip_key_blocks_after_the_queries():
  """Keys 128.. follow every query (128 of them), so no kernel may touch
  their blocks: NaN there would reach the output, dq and dk/dv of any step
  that computed them (masking zeroes P, not P's NaN partners)."""
  q, k, v, cotangent = _inputs(9, 1, 128, 384, 1, 64)
  k = k.at[:, 128:].set(jnp.nan)
  v = v.at[:, 128:].set(jnp.nan)
  out, dq, dk, dv = run(q, k, v, None, None, cotangent, impl="kernel",
                        block_sizes=SMALL_BLOCKS, causal=True)
  want = run(q, k[:, :128], v[:, :128], None, None, cotangent, impl="xla",
             causal=True)
  assert _rel_err(out, want[0]) <= 1e-5
  assert _rel_err(dq, want[1]) <= 1e-4
  assert _rel_err(dk[:, :128], want[2]) <= 1e-4
  assert _rel_err(dv[:, :128], want[3]) <= 1e-4
  np.testing.assert_array_equal(dk[:, 128:], 0.0)
  np.testing.assert_array_equal(dv[:, 128:], 0.0)


def test_causal_calls_on_gpu_go_to_cudnn_and_log_once(caplog):
  """The Mosaic GPU kernel has no causal masking: impl="pallas" hands causal
  GPU calls to cuDNN (xla where cuDNN cannot take them), logged once; the
  TPU kernel takes them."""
  choose = attention._choose  # pylint: disable=protected-access
  attention._log_once.cache_clear()  # pylint: disable=protected-access
  bf16 = [jnp.zeros((1, 8, 2, 64), jnp.bfloat16)] * 3
  f32 = [t.astype(jnp.float32) for t in bf16]
  with caplog.at_level(logging.WARNING, logger=attention.__name__):
    assert choose("pallas", *bf16, False, "gpu", True) == "cudnn"
    assert choose("pallas", *bf16, False, "gpu", True) == "cudnn"
    assert choose("pallas", *f32, False, "gpu", True) == "xla"
    assert choose("auto", *bf16, False, "gpu", True) == "cudnn"
    assert choose("pallas", *f32, False, "tpu", True) == "pallas"
    assert choose("auto", *f32, False, "tpu", True) == "pallas"
  messages = [r.getMessage() for r in caplog.records]
  assert len(messages) == 2, messages
  assert all("no causal masking" in m for m in messages)
  assert "float16/bfloat16, not float32" in messages[1]


@pytest.mark.parametrize("block, length, expected", [
    (512, 128, 128), (512, 384, 384), (512, 640, 128), (512, 1024, 512),
    (256, 768, 256), (384, 768, 384), (512, 768, 384), (128, 8192, 128)])
def test_block_fitting(block, length, expected):
  fit = flash_tpu._fit  # pylint: disable=protected-access
  assert fit(block, length) == expected


@pytest.mark.parametrize("field, value", [
    ("block_q", 64), ("block_kv", 0), ("block_q_dq", 200),
    ("block_kv_dkv", 128.0)])
def test_block_sizes_must_be_lane_multiples(field, value):
  with pytest.raises(ValueError, match=f"BlockSizes.{field}="):
    flash_tpu.BlockSizes(**{field: value})


def test_kernel_refuses_unsupported_inputs():
  q = jnp.zeros((1, 8, 1, 96), jnp.float32)
  with pytest.raises(ValueError, match="Head_dim 96 is not supported"):
    flash_tpu.flash_attention(q, q, q)
  q = jnp.zeros((1, 8, 1, 64), jnp.float32)
  with pytest.raises(ValueError, match="all float32 or all bfloat16"):
    flash_tpu.flash_attention(q, q, q.astype(jnp.bfloat16))


# Causal: query and key blocks of different sizes, so the skipped pairs
# and the clamped block indices are not the square-block special case.
UNEVEN_BLOCKS = flash_tpu.BlockSizes(256, 512, 512, 256, 256, 512)


@pytest.mark.parametrize("masked, dtype, causal", [
    (True, jnp.bfloat16, False), (False, jnp.float32, False),
    (True, jnp.float32, True), (False, jnp.bfloat16, True)])
def test_kernels_lower_to_mosaic_for_tpu(masked, dtype, causal):
  """Pallas → Mosaic lowering for a real TPU (no TPU needed): catches block
  shapes and ops Mosaic refuses, which interpret mode does not check."""
  q = jax.ShapeDtypeStruct((2, 1024, 2, 128 if masked else 64), dtype)
  ids = jax.ShapeDtypeStruct((2, 1024), jnp.int32) if masked else None

  def loss(q, k, v, ids):
    out = flash_tpu.flash_attention(
        q, k, v, ids, block_sizes=UNEVEN_BLOCKS if causal else None,
        causal=causal)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
  text = grad.trace(q, q, q, ids).lower(lowering_platforms=("tpu",)).as_text()
  assert text.count("stablehlo.custom_call @tpu_custom_call") == 3


def test_albert_with_pallas_attention_matches_xla():
  """A tiny ALBERT (head_dim 64) with attention_impl="pallas" against "xla":
  outputs and every parameter's gradient of a loss over all heads."""
  tiny = dict(vocab_size=24, embedding_size=8, hidden_size=128,
              num_attention_heads=2, intermediate_size=32,
              max_position_embeddings=8, num_hidden_layers=1)
  # Row 0 packs two sequences and a pad; row 1 is one sequence.
  inputs = dict(
      input_ids=jnp.asarray([[3, 5, 7, 2, 9, 4, 0], [1, 8, 6, 11, 10, 5, 3]]),
      attention_mask=jnp.asarray([[1, 1, 1, 1, 2, 2, 0], [1] * 7]),
      token_type_ids=jnp.asarray([[0, 0, 1, 1, 0, 1, 0], [0, 0, 0, 1, 1, 1,
                                                         1]]))
  model = {impl: Albert(ModelConfig(**tiny, attention_impl=impl))
           for impl in ("xla", "pallas")}
  shapes = nn.unbox(jax.eval_shape(model["xla"].init, jax.random.PRNGKey(0),
                                   inputs["input_ids"])["params"])
  # Weights well above the 0.02 init so attention is far from uniform.
  leaves, tree = jax.tree.flatten(shapes)
  rng = np.random.default_rng(0)
  params = jax.tree.unflatten(tree, [
      jnp.asarray(rng.normal(size=x.shape) * 0.5, jnp.float32)
      for x in leaves])

  def loss(params, impl):
    out = model[impl].apply({"params": params}, **inputs, deterministic=True)
    weights = jnp.linspace(-1.0, 1.0, out["sequence_output"].size).reshape(
        out["sequence_output"].shape)
    total = sum(jnp.sum(jnp.sin(v)) for v in out.values())
    return total + jnp.sum(out["sequence_output"] * weights), out

  run = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1,
                compiler_options=FAST_COMPILE)
  (_, got), got_grads = run(params, "pallas")
  (_, want), want_grads = run(params, "xla")
  assert got.keys() == want.keys()
  for name in want:
    assert _rel_err(got[name], want[name]) <= 1e-5, name
  # The key bias's gradient is zero in exact arithmetic (it shifts a whole
  # row of logits), so each leaf's error is also bounded relative to the
  # largest gradient of the model: that leaf is then held to rounding noise.
  scale = max(np.abs(np.asarray(w)).max() for w in jax.tree.leaves(want_grads))
  for path, g, w in zip(jax.tree_util.tree_leaves_with_path(want_grads),
                        jax.tree.leaves(got_grads),
                        jax.tree.leaves(want_grads)):
    error = np.abs(np.asarray(g) - np.asarray(w)).max()
    assert error <= 1e-4 * max(np.abs(np.asarray(w)).max(), 1e-2 * scale), (
        jax.tree_util.keystr(path[0]))
