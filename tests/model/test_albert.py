"""The scanned `Albert` against an unrolled jax.numpy reference, and its API.

The reference reads the parameter dict and walks the layers in a Python loop
with the official group mapping, group = int(l / (L / G)), each layer applying
its group's `inner_group_num` blocks; it shares no code with the model.
"""

import functools
import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax.model import encoder as encoder_lib
from albert_jax.model import layers
from albert_jax.model.albert import Albert
from albert_jax.model.config import ModelConfig

TINY = dict(vocab_size=24, embedding_size=8, hidden_size=12,
            num_attention_heads=3, intermediate_size=20,
            max_position_embeddings=12, num_hidden_layers=3)
BATCH, LENGTH = 2, 7
# Row 0 packs two sequences (ids 1 and 2) and a pad; row 1 is one sequence.
MASK = np.asarray([[1, 1, 1, 1, 2, 2, 0], [1] * LENGTH])
POSITIONS = np.asarray([[0, 1, 2, 3, 0, 1, 0], list(range(LENGTH))])
TYPES = np.asarray([[0, 0, 1, 1, 0, 1, 0], [0, 0, 0, 1, 1, 1, 1]])
IDS = np.asarray([[3, 5, 7, 2, 9, 4, 0], [1, 8, 6, 11, 10, 5, 3]])
UNUSED_TOKEN = 20  # not in IDS: its word row is reached only by the decoder.
# LLVM's optimisations dominate compile time on CPU and buy nothing at these
# sizes; numerics are unaffected beyond float rounding. Not the whole of
# training.run_setup.FAST_COMPILE_OPTIONS: without XLA:CPU's fusion emitters the
# remat policies' gradients differ from no remat's by ~2e-6 relative, past
# the exact-recomputation tolerance below.
jit = functools.partial(
    jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def tiny(**overrides):
  return ModelConfig(**{**TINY, **overrides})


def _inputs():
  return dict(input_ids=jnp.asarray(IDS), token_type_ids=jnp.asarray(TYPES),
              attention_mask=jnp.asarray(MASK),
              position_ids=jnp.asarray(POSITIONS))


@functools.lru_cache(maxsize=None)
def abstract_params(cfg):
  """Boxed (logically partitioned) parameter shapes, without running init."""
  variables = jax.eval_shape(Albert(cfg).init, jax.random.PRNGKey(0),
                             jnp.asarray(IDS))
  return variables["params"]


def random_params(cfg, seed=0):
  """Every parameter random (LayerNorm scales near 1), so biases count."""
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = path[-1].key
    noise = rng.normal(size=leaf.shape)
    if name == "scale":
      noise = 1.0 + 0.2 * noise
    elif name in ("bias", "output_bias"):
      noise = 0.2 * noise
    else:  # kernels and embedding tables
      noise = 0.3 * noise
    return jnp.asarray(noise, jnp.float32)

  return jax.tree_util.tree_map_with_path(fill,
                                          nn.unbox(abstract_params(cfg)))


@functools.lru_cache(maxsize=None)
def forward(cfg, deterministic=True):
  """A jitted apply per config, shared by the tests that use the config."""
  model = Albert(cfg)

  def run(params, inputs, rngs=None, masked_positions=None):
    return model.apply({"params": params}, **inputs, rngs=rngs,
                       masked_positions=masked_positions,
                       deterministic=deterministic)

  return jit(run)


# ---------------------------------------------------------------- reference

ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1 + jax.scipy.special.erf(x / math.sqrt(2))),
    "gelu_new": lambda x: 0.5 * x * (1 + jnp.tanh(
        math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: jnp.maximum(x, 0.0),
}


def _layer_norm(x, p, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean)**2).mean(-1, keepdims=True)
  return (x - mean) / jnp.sqrt(var + eps) * p["scale"] + p["bias"]


def _linear(x, p):
  """x [..., n] times a kernel of any shape whose trailing dims are outputs."""
  kernel, bias = p["kernel"], p["bias"]
  n_out = bias.size
  return x @ kernel.reshape(-1, n_out) + bias.reshape(n_out)


def _ref_attention(x, p, mask, cfg):
  b, t, h = x.shape
  nh, hd = cfg.num_attention_heads, h // cfg.num_attention_heads
  q, k, v = (_linear(x, p[n]).reshape(b, t, nh, hd)
             for n in ("query", "key", "value"))
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
  allowed = ((mask[:, :, None] == mask[:, None, :]) &
             (mask[:, None, :] != 0))[:, None]
  scores = jnp.where(allowed, scores, -1e30)
  e = jnp.where(allowed,
                jnp.exp(scores - scores.max(-1, keepdims=True)), 0.0)
  probs = e / jnp.maximum(e.sum(-1, keepdims=True), 1e-30)
  context = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, h)
  y = context @ p["output"]["kernel"].reshape(h, h) + p["output"]["bias"]
  return _layer_norm(x + y, p["layer_norm"], cfg.layer_norm_eps)


def _ref_ffn(x, p, cfg):
  y = ACTIVATIONS[cfg.hidden_act](_linear(x, p["intermediate"]))
  y = _linear(y, p["output"])
  return _layer_norm(x + y, p["layer_norm"], cfg.layer_norm_eps)


def _copy(stack, index):
  return jax.tree.map(lambda w: w[index], stack)


def reference_forward(cfg, p, input_ids, token_type_ids, attention_mask,
                      position_ids, decoder_table=None):
  """Unrolled ALBERT/BERT forward from the parameter dict.

  `decoder_table` replaces the word table in the MLM decoder only, to tell
  the two paths into the tied table apart.
  """
  emb = p["embeddings"]
  x = (emb["word_embeddings"]["embedding"][input_ids] +
       emb["position_embeddings"]["embedding"][position_ids] +
       emb["token_type_embeddings"]["embedding"][token_type_ids])
  x = _layer_norm(x, emb["layer_norm"], cfg.layer_norm_eps)
  enc = p["encoder"]
  if cfg.embedding_projection:
    x = _linear(x, enc["embedding_hidden_mapping_in"])
  num_layers, groups = cfg.num_hidden_layers, cfg.num_hidden_groups
  inner, step = cfg.inner_group_num, 0
  for layer in range(num_layers):
    group = int(layer / (num_layers / groups))
    for i in range(inner):
      shared_copy = group * inner + i
      a = shared_copy if cfg.share in ("all", "attention") else step
      f = shared_copy if cfg.share in ("all", "ffn") else step
      x = _ref_attention(x, _copy(enc["attention"], a), attention_mask, cfg)
      x = _ref_ffn(x, _copy(enc["ffn"], f), cfg)
      step += 1
  pooled = jnp.tanh(_linear(x[:, 0], p["pooler"]))
  y = ACTIVATIONS[cfg.hidden_act](_linear(x, p["mlm"]["transform"]))
  y = _layer_norm(y, p["mlm"]["layer_norm"], cfg.layer_norm_eps)
  if decoder_table is None:
    decoder_table = emb["word_embeddings"]["embedding"]
  logits = y @ decoder_table.T + p["mlm"]["output_bias"]
  return {"sequence_output": x, "pooled_output": pooled,
          "mlm_logits": logits, "sop_logits": _linear(pooled, p["sop"])}


def assert_outputs_close(actual, expected, tol=1e-5):
  assert set(actual) == set(expected)
  for key in expected:
    np.testing.assert_allclose(actual[key], expected[key], rtol=tol, atol=tol,
                               err_msg=key)


# ------------------------------------------------------------------ parity

PARITY_CONFIGS = {
    "all": tiny(share="all"),
    "attention": tiny(share="attention", hidden_act="gelu"),
    "ffn_groups": tiny(share="ffn", num_hidden_groups=2, hidden_act="relu"),
    "none_bert_inner": tiny(share="none", hidden_act="gelu",
                            embedding_size=12, embedding_projection=False,
                            num_hidden_layers=2, inner_group_num=2),
    "all_groups_inner": tiny(share="all", num_hidden_layers=5,
                             num_hidden_groups=2, inner_group_num=2),
    "attention_groups_inner": tiny(share="attention", num_hidden_layers=4,
                                   num_hidden_groups=3, inner_group_num=2),
}


@pytest.mark.parametrize("name", sorted(PARITY_CONFIGS))
def test_scanned_model_matches_unrolled_reference(name):
  cfg = PARITY_CONFIGS[name]
  params = random_params(cfg)
  out = forward(cfg)(params, _inputs())
  assert_outputs_close(out, reference_forward(cfg, params, **_inputs()))


@pytest.mark.parametrize("name", ["all", "none_bert_inner"])
def test_gpu_formulation_matches_unrolled_reference(name, monkeypatch):
  """Traced for a GPU, the attention block adds the value's bias after
  attention (as b_v·W_o, not on padded rows); run here on CPU with every
  bias random, it computes the textbook block's values, padding included."""
  monkeypatch.setattr(layers, "compile_platform", lambda: "gpu")
  cfg = PARITY_CONFIGS[name]
  params = random_params(cfg)
  model = Albert(cfg)
  out = jit(lambda p, inputs: model.apply({"params": p}, **inputs,
                                          deterministic=True))(
                                              params, _inputs())
  assert_outputs_close(out, reference_forward(cfg, params, **_inputs()))


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_attention_block_with_dropout_on_probabilities(platform, monkeypatch):
  """With dropout on the attention probabilities the value's bias cannot
  be added after attention (`AttentionBlock` adds it there on GPU
  otherwise, as b_v·W_o): the block then equals the textbook block with
  the same dropout mask, b_v added to the values, b_k to the keys."""
  from albert_jax.ops import attention as attention_ops
  monkeypatch.setattr(layers, "compile_platform", lambda: platform)
  cfg = tiny(attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.0)
  p = random_params(cfg)["encoder"]["attention"]
  p = jax.tree.map(lambda leaf: leaf[0], p)  # the one shared copy
  x = jnp.asarray(np.random.default_rng(3).normal(size=(BATCH, LENGTH, 12)),
                  jnp.float32)
  seen = {}
  real = attention_ops.dot_product_attention

  def recording(*args, **kwargs):
    seen.update(kwargs)
    return real(*args, **kwargs)

  monkeypatch.setattr(attention_ops, "dot_product_attention", recording)
  block = encoder_lib.AttentionBlock(cfg)
  got = block.apply({"params": p}, x, jnp.asarray(MASK), False,
                    rngs={"dropout": jax.random.PRNGKey(7)})
  assert seen["dropout_rng"] is not None and seen["dropout_rate"] == 0.5
  nh, hd = cfg.num_attention_heads, 12 // cfg.num_attention_heads
  q, k, v = (_linear(x, p[n]).reshape(BATCH, LENGTH, nh, hd)
             for n in ("query", "key", "value"))
  context = real(q, k, v, segment_ids=jnp.asarray(MASK), dropout_rate=0.5,
                 dropout_rng=seen["dropout_rng"], deterministic=False)
  y = (context.reshape(BATCH, LENGTH, 12) @ p["output"]["kernel"].reshape(
      12, 12) + p["output"]["bias"])
  want = _layer_norm(x + y, p["layer_norm"], cfg.layer_norm_eps)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_packed_sequence_equals_the_same_sequence_alone():
  cfg = PARITY_CONFIGS["all"]
  params = random_params(cfg)
  packed = forward(cfg)(params, _inputs())["sequence_output"]
  # Row 0's second sequence (positions 4, 5) moved to the front of a row.
  alone = {k: np.zeros_like(v) for k, v in _inputs().items()}
  for key, source in (("input_ids", IDS), ("token_type_ids", TYPES)):
    alone[key][0, :2] = source[0, 4:6]
  alone["attention_mask"][0, :2] = 1
  alone["position_ids"][0, :2] = [0, 1]
  single = forward(cfg)(params, alone)["sequence_output"]
  np.testing.assert_allclose(packed[0, 4:6], single[0, :2], rtol=1e-5,
                             atol=1e-5)


# ------------------------------------------------------- structure by hand

@pytest.mark.parametrize("share, groups, copies", [
    ("all", 2, {"attention": 4, "ffn": 4}),
    ("attention", 2, {"attention": 4, "ffn": 8}),
    ("ffn", 2, {"attention": 8, "ffn": 4}),
    ("none", 1, {"attention": 8, "ffn": 8}),
])
def test_parameter_stacks_have_one_copy_per_stored_block(share, groups,
                                                         copies):
  cfg = tiny(share=share, num_hidden_layers=4, num_hidden_groups=groups,
             inner_group_num=2)
  assert {c: cfg.num_copies(c) for c in copies} == copies
  enc = abstract_params(cfg)["encoder"]
  ca, cf = copies["attention"], copies["ffn"]
  expected = {
      ("attention", "query", "kernel"): (ca, 12, 3, 4),
      ("attention", "key", "bias"): (ca, 3, 4),
      ("attention", "output", "kernel"): (ca, 3, 4, 12),
      ("attention", "output", "bias"): (ca, 12),
      ("attention", "layer_norm", "scale"): (ca, 12),
      ("ffn", "intermediate", "kernel"): (cf, 12, 20),
      ("ffn", "output", "kernel"): (cf, 20, 12),
      ("ffn", "layer_norm", "bias"): (cf, 12),
  }
  for path, shape in expected.items():
    leaf = functools.reduce(lambda tree, key: tree[key], path, enc)
    assert leaf.value.shape == shape, path
  for component in ("attention", "ffn"):
    for leaf in jax.tree.leaves(enc[component],
                                is_leaf=lambda x: hasattr(x, "names")):
      assert leaf.names[0] == "layers"
      assert leaf.value.shape[0] == copies[component]
  assert enc["embedding_hidden_mapping_in"]["kernel"].value.shape == (8, 12)


def test_bert_style_config_has_no_embedding_projection():
  cfg = PARITY_CONFIGS["none_bert_inner"]
  params = nn.unbox(abstract_params(cfg))
  assert "embedding_hidden_mapping_in" not in params["encoder"]
  assert params["embeddings"]["word_embeddings"]["embedding"].shape == (24,
                                                                         12)


@pytest.mark.parametrize("overrides, component, expected", [
    # The official ALBERT mapping for 12 layers in 5 groups.
    (dict(num_hidden_layers=12, num_hidden_groups=5), "attention",
     [0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4]),
    (dict(num_hidden_layers=3, inner_group_num=2), "ffn", [0, 1] * 3),
    (dict(num_hidden_layers=4, num_hidden_groups=2, inner_group_num=2),
     "attention", [0, 1, 0, 1, 2, 3, 2, 3]),
    (dict(num_hidden_layers=4, num_hidden_groups=3), "ffn", [0, 0, 1, 2]),
    (dict(num_hidden_layers=5, num_hidden_groups=2), "ffn", [0, 0, 0, 1, 1]),
    (dict(share="attention", num_hidden_layers=3, inner_group_num=2), "ffn",
     [0, 1, 2, 3, 4, 5]),
    (dict(share="none", num_hidden_layers=4), "attention", [0, 1, 2, 3]),
])
def test_copy_index_by_hand(overrides, component, expected):
  cfg = tiny(**overrides)
  assert cfg.copy_index(component) == expected
  assert cfg.num_copies(component) == max(expected) + 1


# ------------------------------------------------------------------- heads

def test_pooler_is_tanh_dense_of_first_token():
  cfg = PARITY_CONFIGS["all"]
  params = random_params(cfg)
  out = forward(cfg)(params, _inputs())
  x = out["sequence_output"][:, 0]
  p = params["pooler"]
  np.testing.assert_allclose(out["pooled_output"],
                             np.tanh(x @ p["kernel"] + p["bias"]),
                             rtol=1e-6, atol=1e-6)


def test_mlm_logits_at_masked_positions_are_gathered_all_positions():
  cfg = PARITY_CONFIGS["all"]
  params = random_params(cfg)
  full = forward(cfg)(params, _inputs())["mlm_logits"]
  positions = np.asarray([[0, 3, 5], [6, 1, 1]])
  out = forward(cfg)(params, _inputs(),
                     masked_positions=jnp.asarray(positions))
  assert out["mlm_logits"].shape == (BATCH, 3, 24)
  expected = np.take_along_axis(np.asarray(full), positions[..., None], 1)
  np.testing.assert_allclose(out["mlm_logits"], expected, rtol=1e-6,
                             atol=1e-6)


def test_mlm_decoder_is_tied_to_word_embeddings():
  cfg = PARITY_CONFIGS["all"]
  params = random_params(cfg)
  assert set(params["mlm"]) == {"transform", "layer_norm", "output_bias"}
  before = forward(cfg)(params, _inputs())
  table = params["embeddings"]["word_embeddings"]["embedding"]
  changed = jax.tree.map(lambda x: x, params)
  changed["embeddings"]["word_embeddings"]["embedding"] = table.at[
      UNUSED_TOKEN].add(1.0)
  after = forward(cfg)(changed, _inputs())
  # The row feeds no input, so only its own decoder column moves.
  np.testing.assert_array_equal(after["sequence_output"],
                                before["sequence_output"])
  delta = np.asarray(after["mlm_logits"] - before["mlm_logits"])
  assert np.abs(delta[..., UNUSED_TOKEN]).min() > 1e-4
  expected = (reference_forward(cfg, changed, **_inputs())["mlm_logits"] -
              reference_forward(cfg, params, **_inputs())["mlm_logits"])
  np.testing.assert_allclose(delta[..., UNUSED_TOKEN],
                             expected[..., UNUSED_TOKEN], atol=1e-5)
  np.testing.assert_allclose(np.delete(delta, UNUSED_TOKEN, axis=-1), 0.0,
                             atol=1e-6)


def _mlm_loss(logits):
  return jnp.mean(jax.nn.log_softmax(logits)[..., 2])


def test_word_table_gradient_sums_input_and_decoder_paths():
  cfg = PARITY_CONFIGS["all"]
  params = random_params(cfg)
  table = params["embeddings"]["word_embeddings"]["embedding"]
  model = Albert(cfg)
  grads = jit(jax.grad(lambda p: _mlm_loss(
      model.apply({"params": p}, **_inputs())["mlm_logits"])))(params)
  grad = np.asarray(grads["embeddings"]["word_embeddings"]["embedding"])

  def ref_loss(input_table, decoder_table):
    p = {**params, "embeddings": {**params["embeddings"],
                                  "word_embeddings": {"embedding":
                                                      input_table}}}
    return _mlm_loss(reference_forward(cfg, p, **_inputs(),
                                       decoder_table=decoder_table)
                     ["mlm_logits"])

  via_input, via_decoder = jit(jax.grad(ref_loss, argnums=(0, 1)))(table,
                                                                    table)
  np.testing.assert_allclose(grad, via_input + via_decoder, rtol=1e-4,
                             atol=1e-7)
  token = IDS[0, 0]
  assert np.abs(via_input[token]).max() > 1e-5
  assert np.abs(via_decoder[token]).max() > 1e-5
  np.testing.assert_array_equal(via_input[UNUSED_TOKEN], 0.0)
  assert np.abs(grad[UNUSED_TOKEN]).max() > 1e-5  # learns through decoder


# ------------------------------------------------------------- activations

def test_activations_match_their_formulas():
  x = np.linspace(-5, 5, 101)
  erf = np.vectorize(math.erf)
  gelu = 0.5 * x * (1 + erf(x / math.sqrt(2)))
  gelu_tanh = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                     (x + 0.044715 * x**3)))
  xs = jnp.asarray(x, jnp.float32)
  np.testing.assert_allclose(layers.activation("gelu")(xs), gelu, atol=1e-6)
  np.testing.assert_allclose(layers.activation("gelu_new")(xs), gelu_tanh,
                             atol=1e-6)
  np.testing.assert_allclose(layers.activation("gelu_pytorch_tanh")(xs),
                             gelu_tanh, atol=1e-6)
  np.testing.assert_array_equal(layers.activation("relu")(xs),
                                np.maximum(x, 0).astype(np.float32))
  np.testing.assert_allclose(layers.activation("tanh")(xs), np.tanh(x),
                             atol=1e-6)
  # The two gelus differ enough for the parity tests to tell them apart.
  assert np.abs(gelu - gelu_tanh).max() > 1e-4
  with pytest.raises(ValueError, match="Unknown activation 'swish'"):
    layers.activation("swish")


# ------------------------------------------------------------------- dtype

def test_bfloat16_compute_keeps_float32_params_and_tracks_float32():
  cfg = tiny(dtype="bfloat16")
  for leaf in jax.tree.leaves(nn.unbox(abstract_params(cfg))):
    assert leaf.dtype == jnp.float32
  params = random_params(PARITY_CONFIGS["all"])
  out = forward(cfg)(params, _inputs())
  reference = forward(PARITY_CONFIGS["all"])(params, _inputs())
  for key, value in out.items():
    assert value.dtype == jnp.bfloat16, key
    scale = np.abs(reference[key]).max()
    np.testing.assert_allclose(np.asarray(value, np.float32), reference[key],
                               atol=0.06 * scale, err_msg=key)


# ----------------------------------------------------------------- dropout

def test_dropout_only_with_deterministic_false_and_rngs():
  cfg = tiny(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)
  params = random_params(cfg)
  clean = forward(PARITY_CONFIGS["all"])(params, _inputs())
  rngs = {"dropout": jax.random.PRNGKey(0)}
  assert_outputs_close(forward(cfg)(params, _inputs(), rngs=rngs), clean,
                       tol=1e-6)
  train = forward(cfg, deterministic=False)
  noisy = train(params, _inputs(), rngs=rngs)
  assert np.abs(noisy["sequence_output"] -
                clean["sequence_output"]).max() > 1e-2
  assert_outputs_close(train(params, _inputs(), rngs=rngs), noisy, tol=0)
  other = train(params, _inputs(), rngs={"dropout": jax.random.PRNGKey(1)})
  assert not np.array_equal(other["sequence_output"],
                            noisy["sequence_output"])
  with pytest.raises(flax.errors.InvalidRngError, match="dropout"):
    train(params, _inputs())


def test_training_mode_without_dropout_needs_no_rng():
  cfg = PARITY_CONFIGS["all"]
  params = random_params(cfg)
  assert_outputs_close(forward(cfg, deterministic=False)(params, _inputs()),
                       forward(cfg)(params, _inputs()), tol=1e-6)


@pytest.mark.parametrize("which", ["hidden_dropout_prob",
                                   "attention_probs_dropout_prob"])
def test_each_dropout_rate_is_wired(which):
  cfg = tiny(**{which: 0.5})
  params = random_params(cfg)
  clean = forward(PARITY_CONFIGS["all"])(params, _inputs())
  noisy = forward(cfg, deterministic=False)(
      params, _inputs(), rngs={"dropout": jax.random.PRNGKey(0)})
  assert np.abs(noisy["sequence_output"] -
                clean["sequence_output"]).max() > 1e-2


# ------------------------------------------------------------------- remat

@functools.lru_cache(maxsize=None)
def _loss_and_grads(remat, layer_loop="auto", share="none"):
  cfg = tiny(share=share, num_hidden_layers=2, remat=remat,
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
             layer_loop=layer_loop)
  model = Albert(cfg)

  def loss(params):
    out = model.apply({"params": params}, **_inputs(), deterministic=False,
                      rngs={"dropout": jax.random.PRNGKey(3)})
    return _mlm_loss(out["mlm_logits"]) + jnp.mean(out["sop_logits"]**2)

  return jit(jax.value_and_grad(loss))(random_params(cfg))


@pytest.mark.parametrize("remat", ["full", "dots", "dots_no_batch"])
def test_remat_policies_give_the_same_loss_and_gradients(remat):
  loss, grads = _loss_and_grads(remat)
  ref_loss, ref_grads = _loss_and_grads("none")
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("share", ["all", "none"])
def test_unrolled_layers_give_the_same_loss_and_gradients(share):
  """model.layer_loop: the layer scan unrolled computes what the loop does
  (with dropout, whose per-layer keys the scan splits the same way)."""
  loss, grads = _loss_and_grads("none", layer_loop="unroll", share=share)
  ref_loss, ref_grads = _loss_and_grads("none", layer_loop="scan",
                                        share=share)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def test_remat_needs_the_layer_loop():
  """Why `auto` keeps the loop when remat is set, and `unroll` with remat is
  refused: compiled unrolled, remat full needs the temporaries of no remat
  at all (XLA schedules each recomputation beside its forward pass); in the
  loop it needs far less."""
  def temporaries(layer_loop, remat):
    cfg = tiny(num_hidden_layers=4, hidden_size=64, intermediate_size=256,
               num_attention_heads=4, max_position_embeddings=64)
    # Past the config's check, to compile what it refuses.
    object.__setattr__(cfg, "layer_loop", layer_loop)
    object.__setattr__(cfg, "remat", remat)
    model = Albert(cfg)
    ids = jnp.ones((8, 64), jnp.int32)
    loss = lambda p: jnp.sum(model.apply(  # noqa: E731
        {"params": p}, ids)["sequence_output"] ** 2)
    compiled = jax.jit(jax.grad(loss)).lower(random_params(cfg)).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  unrolled = temporaries("unroll", "full")
  assert unrolled == temporaries("unroll", "none")
  assert temporaries("scan", "full") < 0.7 * unrolled


@pytest.mark.parametrize("platform, unrolled", [
    ("cpu", False), ("gpu", True), ("tpu", True)])
def test_auto_layer_loop_unrolls_on_accelerators(platform, unrolled):
  cfg = tiny()
  device = jax.sharding.AbstractDevice("chip", None, platform)
  mesh = jax.sharding.AbstractMesh((1,), ("data",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    assert encoder_lib.unrolls_layers(cfg) is unrolled
    assert encoder_lib.unrolls_layers(
        tiny(layer_loop="scan")) is False
    assert encoder_lib.unrolls_layers(tiny(layer_loop="unroll")) is True
    # Remat needs the loop (`test_remat_needs_the_layer_loop`).
    assert encoder_lib.unrolls_layers(tiny(remat="full")) is False
  # Unrolled, the FFN's recomputed activation is fenced from CSE (else
  # XLA merges it with the forward's and keeps the output after all).
  model = Albert(tiny(layer_loop="unroll"))
  text = str(jax.make_jaxpr(lambda p: jax.grad(lambda p: jnp.sum(
      model.apply({"params": p}, **_inputs())["sequence_output"]))(p))(
          random_params(cfg)))
  assert "prevent_cse=True" in text
  scanned = str(jax.make_jaxpr(lambda p: jax.grad(lambda p: jnp.sum(
      Albert(cfg).apply({"params": p}, **_inputs())["sequence_output"]))(
          p))(random_params(cfg)))
  assert "prevent_cse=True" not in scanned and "prevent_cse=False" in scanned


# -------------------------------------------------------------- validation

@pytest.mark.parametrize("overrides, match", [
    (dict(num_attention_heads=5), r"hidden_size \(12\) must be divisible by "
     r"model.num_attention_heads \(5\)"),
    (dict(share="none", num_hidden_groups=3),
     r"share='none'.*num_hidden_groups must be 1"),
    (dict(hidden_act="swish"), "Unknown activation 'swish'"),
    (dict(embedding_projection=False),
     r"model.embedding_size \(8\) equal to model.hidden_size \(12\)"),
    (dict(share="some"), r"model.share='some'"),
    (dict(num_hidden_groups=4), r"num_hidden_groups \(4\) exceeds"),
    (dict(remat="everything"), r"model.remat='everything'"),
    (dict(layer_loop="while"), r"model.layer_loop='while'; choose one of"),
    (dict(layer_loop="unroll", remat="full"),
     r"config: model.remat='full' with model.layer_loop='unroll' saves no "
     r"memory"),
    (dict(attention_impl="flash"), r"model.attention_impl='flash'"),
    (dict(hidden_dropout_prob=1.0), r"hidden_dropout_prob must be in \[0, 1"),
    (dict(num_hidden_layers=0), r"num_hidden_layers must be a positive"),
])
def test_invalid_config_is_refused_with_a_clear_message(overrides, match):
  with pytest.raises(ValueError, match=match):
    tiny(**overrides)


def test_sequence_longer_than_positions_is_refused():
  ids = jnp.zeros((1, 13), jnp.int32)
  with pytest.raises(ValueError, match="Sequence length 13 exceeds "
                     "max_position_embeddings 12"):
    jax.eval_shape(Albert(tiny()).init, jax.random.PRNGKey(0), ids)


def test_unknown_head_is_refused():
  with pytest.raises(ValueError, match="Unknown heads"):
    jax.eval_shape(Albert(tiny(), heads=("mlm", "nsp")).init,
                   jax.random.PRNGKey(0), jnp.asarray(IDS))


def test_right_padded_refuses_rows_that_are_not():
  """`right_padded=True` is a promise attention relies on (cuDNN takes row
  lengths): a concrete mask that breaks it is refused, naming the row;
  one that keeps it computes what the plain call does."""
  model = Albert(tiny())
  params = {"params": random_params(tiny())}
  packed = np.asarray([[1, 1, 1, 0, 0, 0, 0], [1, 1, 2, 2, 0, 0, 0]])
  with pytest.raises(ValueError, match=r"row 1 of attention_mask is not one "
                     r"sequence followed by padding"):
    model.apply(params, jnp.asarray(IDS), attention_mask=packed,
                right_padded=True)
  holes = np.asarray([[1, 1, 0, 1, 0, 0, 0], [1] * LENGTH])
  with pytest.raises(ValueError, match="row 0"):
    model.apply(params, jnp.asarray(IDS), attention_mask=holes,
                right_padded=True)
  padded = np.asarray([[1, 1, 1, 1, 0, 0, 0], [1] * LENGTH])
  promised = model.apply(params, jnp.asarray(IDS), attention_mask=padded,
                         right_padded=True)
  plain = model.apply(params, jnp.asarray(IDS), attention_mask=padded)
  np.testing.assert_array_equal(promised["sequence_output"],
                                plain["sequence_output"])
