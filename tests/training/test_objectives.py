"""`albert_jax.training.objectives`: packed pre-training rows are exact.

A packed row holds several `[CLS] A [SEP] B [SEP]` instances; each must come
out as if it had a row of its own: the same MLM logits at its masked
positions and the same sentence logits at its own [CLS] (within 1e-5 in
float32), on the XLA path and the Pallas TPU kernel (interpret mode), for
ALBERT's, BERT's and RoBERTa's shapes; the same loss and gradients for a
batch of the same instances; and no instance sees another (a perturbation
of one changes nothing in its neighbours).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax import config_lib
from albert_jax.model import albert as albert_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives
from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS as FAST

CLS, SEP, MASK, VOCAB = 2, 3, 4, 97
# Instance lengths, and their rows when packed (K = 3): two rows of three
# and one of one, so a row also has an unused slot.
LENGTHS = (9, 12, 7, 14, 6, 8, 20)
GROUPS = ((0, 1, 2), (3, 4, 5), (6,))
K, P = 3, 3  # instances per row; masked slots per instance


def _model_config(kind: str, **overrides) -> ModelConfig:
  shapes = {"albert": dict(share="all", projection=True),
            "bert": dict(share="none", projection=False),
            "roberta": dict(share="none", projection=False,
                            position_ids_from_padding=True, pad_token_id=1,
                            max_position_embeddings=160)}[kind]
  values = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=1,
                intermediate_size=96, num_hidden_layers=2,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                **shapes, **overrides)
  return ModelConfig.from_dict(config_lib.tiny_model(**values))


def _instances(seed: int):
  """(tokens [n], types [n], label, masked positions [P]) per instance;
  tokens already masked ([MASK] at the positions), targets the originals."""
  rng = np.random.default_rng(seed)
  out = []
  for n in LENGTHS:
    a = int(rng.integers(1, n - 3))
    tokens = np.concatenate([[CLS], rng.integers(5, VOCAB, a), [SEP],
                             rng.integers(5, VOCAB, n - a - 3), [SEP]])
    types = (np.arange(n) > a + 1).astype(np.int32)
    maskable = [t for t in range(n) if tokens[t] not in (CLS, SEP)]
    pos = np.sort(rng.choice(maskable, P, replace=False))
    targets = tokens[pos].copy()
    tokens = tokens.copy()
    tokens[pos] = MASK
    out.append((tokens, types, int(rng.integers(0, 2)), pos, targets))
  return out


def _batch(instances, groups, seq: int, packed: bool):
  """The instances in rows of `groups` (one per row when not packed)."""
  if not packed:
    groups = tuple((i,) for i in range(len(instances)))
  b = len(groups)
  slots = K * P if packed else P
  batch = {"input_ids": np.zeros((b, seq), np.int32),
           "token_type_ids": np.zeros((b, seq), np.int32),
           "attention_mask": np.zeros((b, seq), np.int32),
           "masked_positions": np.zeros((b, slots), np.int32),
           "masked_ids": np.zeros((b, slots), np.int32),
           "masked_weights": np.zeros((b, slots), np.float32)}
  labels = np.full((b, K), -1, np.int32)
  cls = np.zeros((b, K), np.int32)
  for row, group in enumerate(groups):
    at = 0
    for slot, i in enumerate(group):
      tokens, types, label, pos, targets = instances[i]
      n = len(tokens)
      batch["input_ids"][row, at:at + n] = tokens
      batch["token_type_ids"][row, at:at + n] = types
      batch["attention_mask"][row, at:at + n] = slot + 1
      cols = slice(slot * P, slot * P + P)
      batch["masked_positions"][row, cols] = pos + at
      batch["masked_ids"][row, cols] = targets
      batch["masked_weights"][row, cols] = 1.0
      labels[row, slot], cls[row, slot] = label, at
      at += n
  if packed:
    batch.update(sentence_labels=labels, cls_positions=cls)
  else:
    batch["sentence_labels"] = labels[:, 0]
  return {k: jnp.asarray(v) for k, v in batch.items()}


@functools.cache
def _setup(kind: str, seq: int, **overrides):
  cfg = _model_config(kind, **overrides)
  model = albert_lib.Albert(cfg, heads=("mlm", "sop"))
  # Initialised on XLA (the parameters do not depend on the attention path;
  # interpret mode cannot run inside the layer stack's batched init).
  init = albert_lib.Albert(dataclasses.replace(cfg, attention_impl="xla"),
                           heads=("mlm", "sop"))
  params = jax.jit(lambda key: init.init(
      key, jnp.zeros((1, seq), jnp.int32),
      masked_positions=jnp.zeros((1, P), jnp.int32))["params"],
                   compiler_options=FAST)(jax.random.key(0))
  instances = _instances(1)
  packed = objectives.MaskedLMObjective(model, packed=True)
  unpacked = objectives.MaskedLMObjective(model, right_padded=True)
  return (params, (packed, _batch(instances, GROUPS, seq, True)),
          (unpacked, _batch(instances, GROUPS, seq, False)))


@functools.cache
def _outputs_fn(objective):
  return jax.jit(lambda p, b: objective.outputs(p, b, None, True),
                 compiler_options=FAST)


def _outputs(objective, params, batch):
  return _outputs_fn(objective)(params, batch)


def _per_instance(out, batch):
  """MLM logits of the real targets [targets, V] and sentence logits of
  the real instances [instances, 2], both in instance order."""
  weights = np.asarray(batch["masked_weights"]) > 0
  labels = np.asarray(batch["sentence_labels"]) >= 0
  return (np.asarray(out["mlm_logits"])[weights],
          np.asarray(out["sop_logits"])[labels])


@pytest.mark.parametrize("kind", ["albert", "bert", "roberta"])
def test_packed_outputs_equal_one_instance_per_row(kind):
  params, (obj_p, packed), (obj_u, unpacked) = _setup(kind, 64)
  assert packed["input_ids"].shape[0] == 3 and unpacked["input_ids"].shape[
      0] == len(LENGTHS)
  mlm_p, sop_p = _per_instance(_outputs(obj_p, params, packed), packed)
  mlm_u, sop_u = _per_instance(_outputs(obj_u, params, unpacked), unpacked)
  assert mlm_p.shape == (len(LENGTHS) * P, VOCAB)
  assert sop_p.shape == (len(LENGTHS), 2)
  np.testing.assert_allclose(mlm_p, mlm_u, atol=1e-5, rtol=0)
  np.testing.assert_allclose(sop_p, sop_u, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["albert", "bert"])
def test_packed_outputs_equal_unpacked_on_the_pallas_kernel(kind):
  """The TPU kernel (interpret mode) takes the packed rows' segment ids;
  128 tokens, one 64-wide head. The layers are unrolled: interpret mode
  cannot run the kernel inside BERT's scan over stacked layers."""
  params, (obj_p, packed), (obj_u, unpacked) = _setup(
      kind, 128, attention_impl="pallas", layer_loop="unroll")
  mlm_p, sop_p = _per_instance(_outputs(obj_p, params, packed), packed)
  mlm_u, sop_u = _per_instance(_outputs(obj_u, params, unpacked), unpacked)
  np.testing.assert_allclose(mlm_p, mlm_u, atol=1e-5, rtol=0)
  np.testing.assert_allclose(sop_p, sop_u, atol=1e-5, rtol=0)


def test_packed_loss_and_gradients_equal_unpacked():
  params, (obj_p, packed), (obj_u, unpacked) = _setup("albert", 64)

  def loss(objective, batch):
    def f(p):
      sums = objective.sums(p, batch, None, True)
      return objectives.loss(sums, objective.denominators(batch)), sums
    return jax.jit(jax.value_and_grad(f, has_aux=True),
                   compiler_options=FAST)(params)

  (loss_p, sums_p), grads_p = loss(obj_p, packed)
  (loss_u, sums_u), grads_u = loss(obj_u, unpacked)
  assert float(sums_p["sop_count"]) == float(sums_u["sop_count"]) == len(
      LENGTHS)
  np.testing.assert_allclose(loss_p, loss_u, atol=1e-5, rtol=0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5,
                                                       rtol=0),
               grads_p, grads_u)
  # Both batches hold the same real tokens; packing leaves less padding.
  assert float(sums_p["real_tokens"]) == float(sums_u["real_tokens"]) == sum(
      LENGTHS)
  metrics_p = obj_p.metrics(sums_p)
  assert float(metrics_p["padding_fraction"]) == pytest.approx(
      1 - sum(LENGTHS) / (3 * 64))
  assert float(obj_u.metrics(sums_u)["padding_fraction"]) == pytest.approx(
      1 - sum(LENGTHS) / (len(LENGTHS) * 64))


def test_no_instance_attends_across_a_boundary():
  """Changing the middle instance of a packed row (its tokens and types)
  moves its own outputs and nothing of its neighbours', bit for bit."""
  params, (obj_p, packed), _ = _setup("albert", 64)
  start, end = LENGTHS[0], LENGTHS[0] + LENGTHS[1]
  changed = dict(packed)
  rng = np.random.default_rng(7)
  ids = np.asarray(packed["input_ids"]).copy()
  ids[0, start + 1:end - 1] = rng.integers(5, VOCAB, end - start - 2)
  changed["input_ids"] = jnp.asarray(ids)
  before = _outputs(obj_p, params, packed)
  after = _outputs(obj_p, params, changed)
  x0, x1 = (np.asarray(o["sequence_output"])[0] for o in (before, after))
  np.testing.assert_array_equal(x0[:start], x1[:start])
  np.testing.assert_array_equal(x0[end:], x1[end:])
  assert np.abs(x0[start:end] - x1[start:end]).max() > 1e-3
  s0, s1 = (np.asarray(o["sop_logits"])[0] for o in (before, after))
  np.testing.assert_array_equal(s0[[0, 2]], s1[[0, 2]])
  assert np.abs(s0[1] - s1[1]).max() > 0
