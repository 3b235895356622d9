"""`dot_product_attention` against a plain NumPy reference, plus its contract.

The contract: inputs are [batch, seq, heads, head_dim]; segment id 0 is
padding and a query attends exactly the keys carrying its own non-zero id;
rows with no valid key are zeros, never NaN.
"""

import functools
import json
import subprocess
import sys

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax.ops import attention

FAST = hypothesis.settings(max_examples=12, deadline=None, derandomize=True,
                           database=None)
# Jitted: one compile per shape is far cheaper than op-by-op dispatch, and
# LLVM's optimisations only cost compile time at these sizes.
fast_jit = functools.partial(
    jax.jit, compiler_options={"xla_backend_optimization_level": 0})
attend = fast_jit(attention.dot_product_attention,
                  static_argnames=("dropout_rate", "deterministic", "impl",
                                   "causal"))


def reference_attention(q, k, v, q_ids=None, kv_ids=None, causal=False):
  """softmax(q kᵀ/√d) v in float64, one query row at a time; `causal`
  keeps only keys j <= i."""
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  batch, q_len, heads, depth = q.shape
  kv_len = k.shape[1]
  if q_ids is None:
    q_ids, kv_ids = np.ones((batch, q_len)), np.ones((batch, kv_len))
  elif kv_ids is None:
    kv_ids = q_ids
  out = np.zeros_like(q)
  for b in range(batch):
    for i in range(q_len):
      valid = (kv_ids[b] == q_ids[b, i]) & (kv_ids[b] != 0)
      if causal:
        valid &= np.arange(kv_len) <= i
      if not valid.any():
        continue
      for h in range(heads):
        logits = k[b, valid, h] @ q[b, i, h] / np.sqrt(depth)
        weights = np.exp(logits - logits.max())
        out[b, i, h] = weights / weights.sum() @ v[b, valid, h]
  return out


def _qkv(rng, batch, q_len, kv_len, heads, depth, scale=2.0):
  q = rng.normal(size=(batch, q_len, heads, depth)) * scale
  k = rng.normal(size=(batch, kv_len, heads, depth)) * scale
  v = rng.normal(size=(batch, kv_len, heads, depth))
  return [jnp.asarray(t, jnp.float32) for t in (q, k, v)]


def _assert_close(actual, expected, rtol=1e-5):
  actual = np.asarray(actual, np.float64)
  assert np.all(np.isfinite(actual))
  np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * 0.1)


@FAST
@hypothesis.given(batch=st.integers(1, 3), length=st.integers(1, 7),
                  heads=st.integers(1, 3), depth=st.integers(1, 8),
                  num_segments=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_self_attention_matches_reference(batch, length, heads, depth,
                                          num_segments, seed):
  rng = np.random.default_rng(seed)
  q, k, v = _qkv(rng, batch, length, length, heads, depth)
  # Ids in 0..num_segments in any order: padding anywhere, several packed
  # sequences per row, possibly rows of padding only.
  ids = rng.integers(0, num_segments + 1, size=(batch, length))
  out = attend(q, k, v, segment_ids=jnp.asarray(ids),
                                        impl="xla")
  assert out.shape == q.shape and out.dtype == jnp.float32
  _assert_close(out, reference_attention(q, k, v, ids))


@FAST
@hypothesis.given(q_len=st.integers(1, 5), kv_len=st.integers(1, 6),
                  seed=st.integers(0, 2**16))
def test_cross_attention_with_own_kv_ids_matches_reference(q_len, kv_len, seed):
  rng = np.random.default_rng(seed)
  q, k, v = _qkv(rng, 2, q_len, kv_len, 2, 4)
  q_ids = rng.integers(0, 3, size=(2, q_len))
  kv_ids = rng.integers(0, 3, size=(2, kv_len))
  out = attend(
      q, k, v, segment_ids=jnp.asarray(q_ids),
      kv_segment_ids=jnp.asarray(kv_ids))
  _assert_close(out, reference_attention(q, k, v, q_ids, kv_ids))


@FAST
@hypothesis.given(batch=st.integers(1, 2), q_len=st.integers(1, 7),
                  kv_len=st.one_of(st.none(), st.integers(1, 7)),
                  num_segments=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_causal_attention_matches_reference(batch, q_len, kv_len,
                                            num_segments, seed):
  """Causal on top of segment ids (packed, padded anywhere, or none), also
  with more or fewer keys than queries."""
  kv_len = q_len if kv_len is None else kv_len
  rng = np.random.default_rng(seed)
  q, k, v = _qkv(rng, batch, q_len, kv_len, 2, 4)
  if num_segments == 0:
    q_ids = kv_ids = None
  else:
    q_ids = rng.integers(0, num_segments + 1, size=(batch, q_len))
    kv_ids = rng.integers(0, num_segments + 1, size=(batch, kv_len))
  out = attend(q, k, v, segment_ids=None if q_ids is None else jnp.asarray(
      q_ids), kv_segment_ids=None if kv_ids is None else jnp.asarray(kv_ids),
               causal=True)
  _assert_close(out, reference_attention(q, k, v, q_ids, kv_ids,
                                         causal=True))


@FAST
@hypothesis.given(length=st.integers(1, 7), num_segments=st.integers(0, 3),
                  causal=st.booleans(), seed=st.integers(0, 2**16))
def test_key_bias_cancels_and_value_bias_passes_through(length, num_segments,
                                                        causal, seed):
  """What the model's attention block relies on (`encoder.AttentionBlock`):
  a bias on the keys shifts each query's logits by one constant, which
  softmax removes, also under dropout of the probabilities; a bias on the
  values comes out unchanged on every row that sees a key (and not at all
  on rows that see none), which dropout breaks (kept probabilities no
  longer sum to 1)."""
  rng = np.random.default_rng(seed)
  q, k, v = _qkv(rng, 2, length, length, 2, 4)
  b_k, b_v = (jnp.asarray(rng.normal(size=(2, 4)) * 3, jnp.float32)
              for _ in range(2))
  ids = (None if num_segments == 0 else
         jnp.asarray(rng.integers(0, num_segments + 1, size=(2, length))))
  run = functools.partial(attend, segment_ids=ids, causal=causal)
  out = run(q, k, v)
  _assert_close(run(q, k + b_k, v), np.asarray(out, np.float64), rtol=2e-5)
  sees_a_key = 1.0 if ids is None else np.asarray(ids != 0)[..., None, None]
  _assert_close(run(q, k, v + b_v),
                np.asarray(out + b_v * sees_a_key, np.float64), rtol=2e-5)
  key = jax.random.PRNGKey(seed)
  dropped = functools.partial(run, dropout_rate=0.5, dropout_rng=key,
                              deterministic=False)
  _assert_close(dropped(q, k + b_k, v), np.asarray(dropped(q, k, v),
                                                   np.float64), rtol=2e-5)


def test_value_bias_does_not_pass_through_dropout():
  q, k, v = _qkv(np.random.default_rng(6), 1, 6, 6, 1, 4)
  b_v = jnp.ones((1, 4), jnp.float32)
  run = functools.partial(attend, dropout_rate=0.5,
                          dropout_rng=jax.random.PRNGKey(0),
                          deterministic=False)
  assert np.abs(np.asarray(run(q, k, v + b_v) - run(q, k, v) - b_v)).max() > 0.1


def test_causal_follows_jax_is_causal_and_first_row_sees_one_key():
  """The mask `jax.nn.dot_product_attention(is_causal=True)` applies (the
  cuDNN path passes it that way), and query 0 sees key 0 alone."""
  q, k, v = _qkv(np.random.default_rng(9), 2, 6, 6, 2, 8)
  ids = jnp.asarray([[1, 1, 1, 2, 2, 0], [1] * 6])
  ours = attend(q, k, v, segment_ids=ids, causal=True)
  jax_causal = fast_jit(functools.partial(jax.nn.dot_product_attention,
                                          is_causal=True))
  theirs = jax_causal(q, k, v, mask=attention.segment_mask(ids, ids))
  valid = np.asarray(ids != 0)
  np.testing.assert_allclose(np.asarray(ours)[valid],
                             np.asarray(theirs)[valid], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ours[:, 0], v[:, 0], rtol=1e-6)
  np.testing.assert_allclose(ours[0, 3], v[0, 3], rtol=1e-6)  # segment start


def test_no_segment_ids_attends_everything_and_auto_is_xla():
  q, k, v = _qkv(np.random.default_rng(0), 2, 5, 5, 3, 4)
  out = attend(q, k, v)
  _assert_close(out, reference_attention(q, k, v))
  np.testing.assert_array_equal(
      out, attend(q, k, v, impl="xla"))


def test_padding_rows_are_exact_zeros_even_with_huge_logits():
  q, k, v = _qkv(np.random.default_rng(1), 3, 4, 4, 2, 4, scale=1e3)
  ids = jnp.asarray([[1, 1, 0, 0], [0, 0, 0, 0], [2, 0, 2, 3]])
  out = np.asarray(attend(q, k, v, segment_ids=ids))
  assert not np.isnan(out).any()
  np.testing.assert_array_equal(out[0, 2:], 0.0)
  np.testing.assert_array_equal(out[1], 0.0)
  np.testing.assert_array_equal(out[2, 1], 0.0)
  # A segment of one token attends only itself: output is its own value.
  np.testing.assert_allclose(out[2, 3], v[2, 3], rtol=1e-6)


def test_gradients_finite_and_zero_through_masked_keys():
  q, k, v = _qkv(np.random.default_rng(2), 2, 5, 5, 2, 3)
  ids = jnp.asarray([[1, 1, 2, 2, 0], [0, 0, 0, 0, 0]])
  cotangent = jnp.asarray(
      np.random.default_rng(3).normal(size=q.shape), jnp.float32)

  def loss(q, k, v, cotangent):
    out = attention.dot_product_attention(q, k, v, segment_ids=ids)
    return jnp.sum(out * cotangent)

  grad_fn = fast_jit(jax.grad(loss, argnums=(0, 1, 2)))
  grads = grad_fn(q, k, v, cotangent)
  for g in grads:
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(g[0, 4], 0.0)  # padding key / query
    np.testing.assert_array_equal(g[1], 0.0)  # all-padding row
  assert np.abs(grads[1][0, :4]).min() > 0  # valid keys do get gradient
  # Only segment 1's queries in the loss: segment 2's keys get nothing.
  only_first = cotangent.at[:, 2:].set(0.0)
  _, gk, gv = grad_fn(q, k, v, only_first)
  np.testing.assert_array_equal(gk[0, 2:], 0.0)
  np.testing.assert_array_equal(gv[0, 2:], 0.0)
  assert np.abs(gv[0, :2]).min() > 0


def test_dropout_contract():
  q, k, v = _qkv(np.random.default_rng(4), 2, 6, 6, 2, 4)
  ids = jnp.asarray([[1, 1, 1, 2, 2, 0], [1] * 6])

  def run(**kwargs):
    return attend(q, k, v, segment_ids=ids, **kwargs)

  clean = run()
  # deterministic=True ignores the rate and needs no rng.
  np.testing.assert_array_equal(run(dropout_rate=0.9), clean)
  np.testing.assert_array_equal(
      run(dropout_rate=0.9, dropout_rng=jax.random.PRNGKey(0)), clean)
  # Rate 0 with deterministic=False is the clean output.
  np.testing.assert_array_equal(run(deterministic=False), clean)
  key = jax.random.PRNGKey(1)
  dropped = run(dropout_rate=0.5, dropout_rng=key, deterministic=False)
  assert np.abs(np.asarray(dropped - clean)).max() > 1e-3
  np.testing.assert_array_equal(
      run(dropout_rate=0.5, dropout_rng=key, deterministic=False), dropped)
  assert not np.array_equal(
      run(dropout_rate=0.5, dropout_rng=jax.random.PRNGKey(2),
          deterministic=False), dropped)
  np.testing.assert_array_equal(np.asarray(dropped)[0, 5], 0.0)  # padding
  with pytest.raises(ValueError, match="dropout_rng"):
    run(dropout_rate=0.5, deterministic=False)


def test_dropout_is_unbiased():
  """Kept probabilities are rescaled by 1/(1-rate): the mean is the clean."""
  q, k, v = _qkv(np.random.default_rng(5), 1, 4, 4, 1, 2, scale=0.5)
  clean = attend(q, k, v)
  keys = jax.random.split(jax.random.PRNGKey(0), 4000)
  samples = fast_jit(jax.vmap(lambda key: attention.dot_product_attention(
      q, k, v, dropout_rate=0.5, dropout_rng=key, deterministic=False)))(keys)
  np.testing.assert_allclose(samples.mean(0), clean, atol=0.04)


def test_bfloat16_inputs_give_bfloat16_close_to_reference():
  q, k, v = _qkv(np.random.default_rng(6), 2, 5, 5, 2, 8, scale=1.0)
  ids = np.asarray([[1, 1, 1, 0, 0], [1, 2, 2, 2, 0]])
  out = attend(
      *(t.astype(jnp.bfloat16) for t in (q, k, v)),
      segment_ids=jnp.asarray(ids))
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32),
                             reference_attention(q, k, v, ids), atol=3e-2)


@pytest.mark.parametrize("shapes, kwargs, match", [
    (((2, 4, 8), (2, 4, 8), (2, 4, 8)), {}, r"\[batch, seq, heads"),
    (((2, 4, 2, 8), (2, 4, 2, 8), (2, 5, 2, 8)), {}, "k and v of one shape"),
    (((2, 4, 2, 8), (2, 4, 2, 4), (2, 4, 2, 4)), {}, "head_dim"),
    (((2, 4, 3, 8), (2, 4, 2, 8), (2, 4, 2, 8)), {}, "heads"),
    (((1, 4, 2, 8), (2, 4, 2, 8), (2, 4, 2, 8)), {}, "batch"),
    (((2, 4, 2, 8),) * 3, {"segment_ids": (2, 5)}, r"segment_ids must be"),
    (((2, 3, 2, 8), (2, 4, 2, 8), (2, 4, 2, 8)), {"segment_ids": (2, 3)},
     r"\[batch, kv_len\]"),
    (((2, 4, 2, 8),) * 3, {"kv_segment_ids": (2, 4)}, "needs segment_ids"),
    (((2, 4, 2, 8),) * 3, {"impl": "flash"}, "Unknown attention impl"),
    (((2, 4, 2, 8),) * 3, {"dropout_rate": 1.0}, r"dropout_rate must be"),
    (((2, 4, 2, 8),) * 3, {"impl": "pallas"}, "head_dim 8 is not supported"),
    (((2, 4, 2, 64),) * 3, {"impl": "pallas", "dtype": jnp.float16},
     "all float32 or all bfloat16"),
])
def test_bad_inputs_raise_clear_value_errors(shapes, kwargs, match):
  kwargs = dict(kwargs)
  dtype = kwargs.pop("dtype", jnp.float32)
  q, k, v = (jnp.zeros(s, dtype) for s in shapes)
  for name in ("segment_ids", "kv_segment_ids"):
    if name in kwargs:
      kwargs[name] = jnp.ones(kwargs[name], jnp.int32)
  with pytest.raises(ValueError, match=match):
    attention.dot_product_attention(q, k, v, **kwargs)


def test_segment_mask_by_hand():
  mask = attention.segment_mask(jnp.asarray([[1, 1, 2, 0]]),
                                jnp.asarray([[1, 2, 2, 0]]))
  expected = [[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0]]
  assert mask.shape == (1, 1, 4, 4)
  np.testing.assert_array_equal(mask[0, 0], np.asarray(expected, bool))


# Run in a subprocess: 4 fake CPU devices must be set before JAX starts, and
# this process's JAX (conftest.py) has one.
_SHARD_WORKER = r'''
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from albert_jax import sharding
from albert_jax.ops import attention

seen = []

def kernel(q, k, v, q_ids, kv_ids):  # the XLA path, recording its shapes
  seen.append([list(q.shape), None if q_ids is None else list(q_ids.shape)])
  mask = None if q_ids is None else attention.segment_mask(q_ids, kv_ids)
  return attention._xla_attention(q, k, v, mask, 0.0, None, True)

results = []
rng = np.random.default_rng(0)
for axes, batch, heads, with_ids in [
    ([("data", 2), ("tensor", 2)], 4, 2, True),
    ([("data", 2), ("fsdp", 2)], 4, 3, False),
    ([("data", 4)], 6, 2, True)]:
  q, k, v = (jnp.asarray(rng.normal(size=(batch, 5, heads, 64)), jnp.float32)
             for _ in range(3))
  ids = jnp.asarray(rng.integers(0, 3, size=(batch, 5))) if with_ids else None
  want = kernel(q, k, v, ids, ids)
  seen.clear()
  mesh = sharding.make_mesh(axes)
  with jax.set_mesh(mesh):
    got = jax.jit(lambda q, k, v, ids: attention._per_shard(
        kernel, q, k, v, ids, ids))(q, k, v, ids)
    try:
      attention.dot_product_attention(q, k, v, impl="pallas")
      error = None
    except ValueError as e:
      error = str(e)
  results.append(dict(seen=seen[-1], diff=float(np.abs(got - want).max()),
                      pallas_error=error))
print(json.dumps(results))
'''


def test_kernels_run_per_shard_under_a_mesh(tmp_path):
  """Under a multi-device mesh a kernel sees its device's share of the batch
  (data, fsdp) and heads (tensor) and the result is the unsharded one."""
  script = tmp_path / "shard_worker.py"
  script.write_text(_SHARD_WORKER)
  proc = subprocess.run([sys.executable, str(script)], capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  results = json.loads(proc.stdout.strip().splitlines()[-1])
  # [batch, seq, heads, dim] per shard; ids [batch, seq] or None.
  assert [r["seen"] for r in results] == [
      [[2, 5, 1, 64], [2, 5]],  # data x tensor
      [[1, 5, 3, 64], None],  # batch over data and fsdp; 3 heads stay whole
      [[6, 5, 2, 64], [6, 5]],  # 4 does not divide the batch: replicated
  ]
  for r in results:
    assert r["diff"] <= 1e-6
    assert "cannot run under a multi-device mesh" in r["pallas_error"]


def _gpu_compiled_attention(right_padded: bool, impl: str = "cudnn") -> str:
  """HLO of attention over right-padded rows, compiled for an H100 here."""
  from albert_jax.tools import topology  # pylint: disable=g-import-not-at-top
  mesh = jax.sharding.Mesh(topology.devices("h100"), ("data",))
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  q = jax.ShapeDtypeStruct((2, 128, 4, 64), jnp.bfloat16, sharding=whole)
  ids = jax.ShapeDtypeStruct((2, 128), jnp.int32, sharding=whole)

  def loss(q, ids):
    out = attention.dot_product_attention(
        q, q, q, segment_ids=ids, impl=impl, right_padded=right_padded,
        deterministic=False)
    return jnp.sum(out.astype(jnp.float32))

  with topology.gpu_lowering("h100"), jax.set_mesh(mesh):
    return jax.jit(jax.grad(loss)).lower(q, ids).compile().as_text()


@pytest.mark.skipif(
    not __import__("albert_jax.tools.topology", fromlist=["x"])
    .gpu_plugin_available(), reason="no CUDA plugin (the gpu_aot extra)")
def test_right_padded_rows_give_cudnn_lengths_not_a_bias():
  """`right_padded`: cuDNN's padding mask from row lengths, no dense
  [B, 1, T, T] bias to build, read or differentiate; without it, the
  mask becomes a bias (forward and backward)."""
  lengths = _gpu_compiled_attention(True)
  assert '"mask_type":"PADDING"' in lengths.replace(" ", "")
  assert "__cudnn$fmhaSoftmax\"" in lengths
  assert "__cudnn$fmhaSoftmaxBackward\"" in lengths
  assert "Bias" not in "".join(
      line for line in lengths.splitlines() if "custom_call_target" in line)
  bias = _gpu_compiled_attention(False)
  assert "__cudnn$fmhaScaleBiasSoftmax\"" in bias
  assert "bf16[2,1,128,128]" in bias


def test_right_padded_is_the_same_attention_on_xla():
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 8, 2, 16)), jnp.float32)
             for _ in range(3))
  ids = jnp.asarray([[1] * 5 + [0] * 3, [1] * 8], jnp.int32)
  plain = attention.dot_product_attention(q, k, v, segment_ids=ids,
                                          impl="xla")
  promised = attention.dot_product_attention(q, k, v, segment_ids=ids,
                                             impl="xla", right_padded=True)
  np.testing.assert_array_equal(promised, plain)
  assert not np.any(np.asarray(promised)[0, 5:])


@pytest.mark.parametrize("seq, training, segments, right_padded, chosen", [
    # The measured table (ops/hopper_rates.py): Pallas's segment ids beat
    # cuDNN's lengths at s128 (79.0 vs 74.3); cuDNN with lengths wins at
    # s512 (202.2 vs 165.3 training, 237.8 vs 176.2 inference) and without
    # a mask (214.7 vs 191.0); Pallas edges out cuDNN's dense bias at s512
    # (165.3 vs 161.8); cuDNN at s2048.
    (128, True, True, True, "pallas"),
    (512, True, True, True, "cudnn"),
    (512, False, True, True, "cudnn"),
    (512, True, False, False, "cudnn"),
    (512, True, True, False, "pallas"),
    (2048, True, False, False, "cudnn"),
])
def test_auto_on_hopper_follows_the_measured_rates(seq, training, segments,
                                                   right_padded, chosen):
  q = jnp.zeros((1, seq, 2, 64), jnp.bfloat16)
  got = attention._choose(  # pylint: disable=protected-access
      "auto", q, q, q, False, "gpu", segments=segments,
      right_padded=right_padded, training=training)
  assert got == chosen
  # Causal calls and head dims the kernel does not take stay on cuDNN.
  assert attention._choose("auto", q, q, q, False, "gpu",  # pylint: disable=protected-access
                           causal=True, segments=segments) == "cudnn"
  wide = jnp.zeros((1, seq, 2, 96), jnp.bfloat16)
  assert attention._choose("auto", wide, wide, wide, False, "gpu",  # pylint: disable=protected-access
                           segments=segments, training=training) == "cudnn"
