"""finetune/packing.py: several examples in a row, exactly as one per row.

  * `pack` by hand on a small case, and as properties (hypothesis): every
    example exactly once, its tokens and type ids intact, no row
    over T or K, segments 1..k, `unpack` back to the examples' order;
  * exactness: each example's logits in a packed row equal its logits alone
    in a row (float32, XLA attention, within 1e-5), and the loss and
    gradients of a packed batch equal the unpacked batch's; changing one
    example's tokens changes no other example's logits;
  * refusals: tasks that do not pack, packing with the next-token loss, bad
    values of config.data.pack;
  * a step of a packed run takes the rows that hold `batch_size` examples on
    average (`rows_per_step`), so its epochs are the unpacked run's; each
    epoch is packed afresh from its shuffle, batches a function of (seed,
    step) (`PackedBatches`).
"""

import dataclasses
import importlib.util
import json
import os

import flax.linen as nn
import hypothesis
from hypothesis import strategies as st
import jax
import ml_collections
import numpy as np
import pytest

from albert_jax import config_lib
from albert_jax.finetune import batching
from albert_jax.finetune.tasks.classification import single_label
from albert_jax.finetune import packing
from albert_jax.finetune.serving import fine_tuned as predict_lib
from albert_jax.finetune.serving import prediction_files
from albert_jax.finetune import registry
from albert_jax.finetune import run as ft
from albert_jax.finetune import spec as spec_lib
from albert_jax.finetune.task import TaskObjective
from albert_jax.finetune.task_type import PredictError
from albert_jax.model.config import ModelConfig
from locations import CONFIGS

T = 16
PAD = 0


def _examples(lengths, t=T, seed=0):
  """Right-padded examples of these lengths, labels 0..n-1."""
  rng = np.random.default_rng(seed)
  n = len(lengths)
  out = {"input_ids": np.full((n, t), PAD, np.int32),
         "token_type_ids": np.zeros((n, t), np.int32),
         "attention_mask": np.zeros((n, t), np.int32),
         "labels": np.arange(n, dtype=np.int32) % 3}
  for i, m in enumerate(lengths):
    out["input_ids"][i, :m] = rng.integers(5, 90, m)
    out["token_type_ids"][i, m // 2:m] = 1
    out["attention_mask"][i, :m] = 1
  return out


def test_pack_by_hand():
  ex = _examples([5, 9, 3, 7, 16])
  p = packing.pack(ex, 3)
  # First fit decreasing: 16 fills row 0; 9 opens row 1 and 7 fills it;
  # 5 opens row 2 and 3 joins it (8 positions left).
  np.testing.assert_array_equal(p["slot_index"],
                                [[4, -1, -1], [1, 3, -1], [0, 2, -1]])
  np.testing.assert_array_equal(p["cls_positions"],
                                [[0, 0, 0], [0, 9, 0], [0, 5, 0]])
  np.testing.assert_array_equal(p["attention_mask"][1], [1] * 9 + [2] * 7)
  np.testing.assert_array_equal(p["attention_mask"][2],
                                [1] * 5 + [2] * 3 + [0] * 8)
  np.testing.assert_array_equal(p["input_ids"][1, 9:16],
                                ex["input_ids"][3, :7])
  np.testing.assert_array_equal(p["token_type_ids"][2, 5:8],
                                ex["token_type_ids"][2, :3])
  np.testing.assert_array_equal(p["labels"], [[1, 0, 0], [1, 0, 0],
                                              [0, 2, 0]])
  np.testing.assert_array_equal(p["slot_weights"], [[1, 0, 0], [1, 1, 0],
                                                    [1, 1, 0]])
  assert packing.padding_fraction(p) == pytest.approx(1 - 40 / 48)
  assert packing.padding_fraction(ex) == pytest.approx(1 - 40 / 80)
  # A tagger's per-token labels are laid out as the tokens, padding -1.
  ex["tags"] = np.where(ex["attention_mask"] > 0,
                        np.arange(5)[:, None] * 100 + np.arange(T), -1)
  p = packing.pack(ex, 3, token_keys=("tags",))
  np.testing.assert_array_equal(p["tags"][0], list(range(400, 416)))
  np.testing.assert_array_equal(
      p["tags"][2], list(range(5)) + list(range(200, 203)) + [-1] * 8)
  assert "tags" in packing.packed_features(
      {"input_ids": ((T,), np.int32), "tags": ((T,), np.int32)}, 3,
      ("tags",)) and packing.packed_features(
          {"input_ids": ((T,), np.int32), "tags": ((T,), np.int32)}, 3,
          ("tags",))["tags"] == ((T,), np.int32)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    lengths=st.lists(st.integers(1, T), min_size=1, max_size=40),
    per_row=st.integers(2, 6))
def test_pack_properties(lengths, per_row):
  ex = _examples(lengths)
  p = packing.pack(ex, per_row)
  index = p["slot_index"]
  assert sorted(index[index >= 0].tolist()) == list(range(len(lengths)))
  for r in range(len(index)):
    members = [i for i in index[r] if i >= 0]
    assert 1 <= len(members) <= per_row
    assert sum(lengths[i] for i in members) <= T
    for slot, i in enumerate(members):
      at, m = p["cls_positions"][r, slot], lengths[i]
      np.testing.assert_array_equal(p["input_ids"][r, at:at + m],
                                    ex["input_ids"][i, :m])
      np.testing.assert_array_equal(p["attention_mask"][r, at:at + m],
                                    slot + 1)
    assert np.count_nonzero(p["attention_mask"][r]) == sum(
        lengths[i] for i in members)
  # Predictions of the slots, and of the tokens, back in the examples'
  # order: a token's fake prediction names its example and position.
  fake = {"prediction": np.where(index >= 0, index * 10, -7)}
  segments = p["attention_mask"]
  example = np.take_along_axis(index, np.maximum(segments - 1, 0), axis=1)
  start = np.take_along_axis(p["cls_positions"], np.maximum(segments - 1, 0),
                             axis=1)
  fake["tags"] = np.where(segments > 0, 1000 * example + np.arange(T) - start
                          + 1, -7)
  back = packing.unpack(fake, p, len(lengths), token_keys=("tags",))
  np.testing.assert_array_equal(back["prediction"],
                                np.arange(len(lengths)) * 10)
  want = np.zeros((len(lengths), T), np.int64)
  for i, m in enumerate(lengths):
    want[i, :m] = 1000 * i + np.arange(m) + 1
  np.testing.assert_array_equal(back["tags"], want)


def _packed_batches(seed=0, batch=12, n=50):
  lengths = np.random.default_rng(7).integers(2, 9, n)
  return batching.PackedBatches(_examples(lengths), 4, batch, seed=seed)


def test_packed_batches_are_a_function_of_seed_and_step():
  a, b = _packed_batches(), _packed_batches()
  later = [b.train_batch(s) for s in (9, 3, 0)]  # a resumed run's order
  for s, got in zip((9, 3, 0), later):
    want = a.train_batch(s)
    assert want.keys() == got.keys()
    for k in want:
      np.testing.assert_array_equal(want[k], got[k], err_msg=k)
  other = _packed_batches(seed=1).train_batch(0)
  assert not np.array_equal(other["slot_index"], a.train_batch(0)[
      "slot_index"])


def test_each_epoch_is_packed_afresh_and_holds_every_example_once():
  batches = _packed_batches()
  r = batches.batch_size
  per_epoch = batches.rows_per_epoch
  steps = -(-3 * per_epoch // r) + 1  # past the end of epoch 2
  seen = {}  # epoch → example ids of its rows, in row order
  rows_of = {}
  for step in range(steps):
    batch = batches.train_batch(step)
    assert batch["input_ids"].shape[0] == r
    at = 0
    for epoch, rows in batches.train_rows(step):
      for i in range(len(rows)):
        ids = batch["slot_index"][at + i]
        seen.setdefault(epoch, []).extend(ids[ids >= 0].tolist())
        rows_of.setdefault(epoch, []).append(tuple(sorted(ids[ids >= 0])))
      at += len(rows)
  for epoch in (0, 1, 2):
    assert sorted(seen[epoch]) == list(range(50)), epoch
  # Which examples share a row changes from epoch to epoch.
  assert set(rows_of[0]) != set(rows_of[1]) != set(rows_of[2])
  # Packing fills the longest examples' rows first; an epoch's rows are
  # shuffled, so its steps are not ordered by how full their rows are.
  fill = np.count_nonzero(batches._epoch(0)["attention_mask"], axis=1)  # pylint: disable=protected-access
  assert list(fill) != sorted(fill, reverse=True)
  unshuffled = packing.pack(
      {k: v[np.random.default_rng([0, 0]).permutation(50)]
       for k, v in batches.features.items()}, batches.per_row)
  assert sorted(fill) == sorted(np.count_nonzero(
      unshuffled["attention_mask"], axis=1))
  # A step holds batch_size (12) examples on average over the epochs.
  assert 3 * 50 / (3 * per_epoch / r) == pytest.approx(12, rel=0.25)


@pytest.fixture(name="setup", scope="module")
def fixture_setup(tmp_path_factory):
  d = tmp_path_factory.mktemp("pack_task")
  (d / "t.tsv").write_text("text\tlabel\na b\tx\nc d\ty\ne f\tz\n")
  task = registry.make_task("files", ml_collections.ConfigDict(dict(
      train_file=str(d / "t.tsv"), eval_file=str(d / "t.tsv"),
      text_column="text", label_column="label")))
  cfg = ModelConfig.from_dict({**config_lib.tiny_model(
      vocab_size=100, max_position_embeddings=T), "dtype": "float32",
                               "attention_impl": "xla"})
  return task, cfg


def _loss_and_grads(task, model, params, batch, compiler_options):
  """The task's loss over `batch` (its mean over the real examples) and its
  gradients."""
  def f(p):
    objective = TaskObjective(model, task)
    sums = objective.sums(p, batch, None, True)
    return sums["task_loss_sum"] / objective.denominators(batch)["task"]
  return jax.jit(jax.value_and_grad(f),
                 compiler_options=compiler_options)(params)


def _assert_same_loss_and_grads(got, want):
  np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5,
                               rtol=1e-4)


def test_packed_rows_give_each_example_its_own_outputs_loss_and_grads(
    setup, fast_compile):
  task, cfg = setup
  lengths = [5, 9, 3, 7, 16, 2, 4]
  ex = _examples(lengths, seed=1)
  ex["weights"] = np.ones(len(lengths), np.float32)
  packed = packing.pack({k: v for k, v in ex.items() if k != "weights"}, 4)
  packed["weights"] = np.ones(len(packed["input_ids"]), np.float32)
  one = spec_lib.for_task(task, cfg, T)
  many = spec_lib.for_task(task, cfg, T, pack=4)
  params = nn.meta.unbox(jax.jit(one.init_params,
                                 compiler_options=fast_compile)(
                                     jax.random.key(3)))
  # The packed model's parameters are the same tree: one model, two layouts.
  assert (jax.tree.map(np.shape, many.abstract_params())
          == jax.tree.map(np.shape, params))
  apply = jax.jit(lambda m, b: m.apply({"params": params}, b),
                  static_argnums=0, compiler_options=fast_compile)
  alone = np.asarray(apply(one.model, ex)["logits"])  # [N, C]
  together = np.asarray(apply(many.model, packed)["logits"])  # [R, K, C]
  back = packing.unpack({"logits": together}, packed,
                        len(lengths))["logits"]
  np.testing.assert_allclose(back, alone, atol=1e-5, rtol=1e-5)

  l1, g1 = _loss_and_grads(task, one.model, params, ex, fast_compile)
  l2, g2 = _loss_and_grads(task, many.model, params, packed, fast_compile)
  _assert_same_loss_and_grads((l2, g2), (l1, g1))

  # No example sees another: change the tokens (all but its [CLS]) of the
  # second example of a row that holds several, and every other example's
  # logits stay as they were.
  row = int(np.flatnonzero(packed["slot_index"][:, 1] >= 0)[0])
  victim = packed["slot_index"][row, 1]
  changed = {k: v.copy() for k, v in packed.items()}
  at = changed["cls_positions"][row, 1]
  changed["input_ids"][row, at + 1:at + lengths[victim]] = 7
  other = packing.unpack(
      {"logits": np.asarray(apply(many.model, changed)["logits"])},
      packed, len(lengths))["logits"]
  keep = np.arange(len(lengths)) != victim
  np.testing.assert_allclose(other[keep], back[keep], atol=1e-6)
  assert not np.allclose(other[victim], back[victim])


FAMILIES = {"bert": dict(share="none", projection=False),
            "roberta": dict(share="none", projection=False,
                            position_ids_from_padding=True, pad_token_id=1,
                            max_position_embeddings=160),
            "albert": dict(share="all", projection=True)}


@pytest.mark.parametrize("family,impl", [("bert", "xla"),
                                         ("roberta", "xla"),
                                         ("albert", "pallas")])
def test_packed_examples_equal_alone_on_each_family_and_kernel(
    setup, family, impl, fast_compile):
  """Classification logits of examples packed 4 a row equal the same
  examples one a row within 1e-5 (float32) on BERT's and RoBERTa's shapes
  (RoBERTa counts positions from pad_token_id + 1) and through the Pallas
  attention kernel (interpret mode on CPU: 128 tokens, one 64-wide head,
  layers unrolled), which takes the packed rows' segment ids."""
  task, _ = setup
  t = 128 if impl == "pallas" else T
  values = {**dict(vocab_size=100, hidden_size=64, num_attention_heads=1,
                  intermediate_size=96, num_hidden_layers=2,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  max_position_embeddings=t), **FAMILIES[family]}
  cfg = ModelConfig.from_dict({**config_lib.tiny_model(**values),
                               "dtype": "float32", "attention_impl": "xla"})
  lengths = [5, 9, 3, 7, 16, 2, 4] if t == T else [40, 90, 17, 60, 128, 9]
  ex = _examples(lengths, t=t, seed=4)
  if family == "roberta":  # its padding id, which its positions skip
    ex["input_ids"][ex["attention_mask"] == 0] = 1
  packed = packing.pack(ex, 4)
  one = spec_lib.for_task(task, cfg, t)
  params = nn.meta.unbox(jax.jit(one.init_params,
                                 compiler_options=fast_compile)(
                                     jax.random.key(5)))
  if impl == "pallas":  # parameters do not depend on the attention path
    cfg = dataclasses.replace(cfg, attention_impl="pallas",
                              layer_loop="unroll")
  one = spec_lib.for_task(task, cfg, t)
  many = spec_lib.for_task(task, cfg, t, pack=4)
  apply = jax.jit(lambda m, b: m.apply({"params": params}, b),
                  static_argnums=0, compiler_options=fast_compile)
  alone = np.asarray(apply(one.model, ex)["logits"])
  back = packing.unpack({"logits": np.asarray(apply(many.model, packed)[
      "logits"])}, packed, len(lengths))["logits"]
  np.testing.assert_allclose(back, alone, atol=1e-5, rtol=0)


def _race():
  return registry.make_task("race/middle", ml_collections.ConfigDict())


@pytest.fixture(name="tagger", scope="module")
def fixture_tagger(tmp_path_factory):
  d = tmp_path_factory.mktemp("pack_ner")
  (d / "n.txt").write_text("EU NNP B-NP B-ORG\nsays VBZ B-VP O\n"
                           "Peter NNP B-NP B-PER\n\n")
  return registry.make_task("ner/files", ml_collections.ConfigDict(dict(
      train_file=str(d / "n.txt"), eval_file=str(d / "n.txt"))))


def test_packed_sentences_are_tagged_and_scored_as_alone(setup, tagger,
                                                         fast_compile):
  """Tagging packed: each sentence's per-token logits equal its logits
  alone in a row, and the loss (each sentence's mean over its labelled
  sub-words, averaged over sentences) and gradients equal the unpacked
  batch's."""
  _, cfg = setup
  lengths = [5, 9, 3, 7, 16, 2, 4]
  ex = _examples(lengths, seed=2)
  rng = np.random.default_rng(0)
  labelled = (ex["attention_mask"] > 0) & (rng.random(ex["attention_mask"]
                                                      .shape) < 0.6)
  ex["labels"] = np.where(labelled, rng.integers(0, len(tagger.labels),
                                                 labelled.shape), -1)
  ex["labels"] = ex["labels"].astype(np.int32)
  packed = packing.pack(ex, 4, tagger.token_keys)
  ex["weights"] = np.ones(len(lengths), np.float32)
  packed["weights"] = np.ones(len(packed["input_ids"]), np.float32)
  one = spec_lib.for_task(tagger, cfg, T)
  many = spec_lib.for_task(tagger, cfg, T, pack=4)
  assert many.features["labels"] == ((T,), np.int32)
  params = nn.meta.unbox(jax.jit(one.init_params,
                                 compiler_options=fast_compile)(
                                     jax.random.key(3)))
  apply = jax.jit(lambda m, b: m.apply({"params": params}, b),
                  static_argnums=0, compiler_options=fast_compile)
  alone = np.asarray(apply(one.model, ex)["logits"])  # [N, T, L]
  together = np.asarray(apply(many.model, packed)["logits"])  # [R, T, L]
  back = packing.unpack({"logits": together}, packed, len(lengths),
                        ("logits",))["logits"]
  real = ex["attention_mask"] > 0
  np.testing.assert_allclose(back[real], alone[real], atol=1e-5, rtol=1e-5)
  assert not np.any(back[~real])

  l1, g1 = _loss_and_grads(tagger, one.model, params, ex, fast_compile)
  l2, g2 = _loss_and_grads(tagger, many.model, params, packed, fast_compile)
  # The unpacked loss by hand: each sentence's mean NLL, then their mean.
  logp = alone - np.log(np.exp(alone).sum(-1, keepdims=True))
  per = [np.mean([-logp[i, t, ex["labels"][i, t]]
                  for t in np.flatnonzero(ex["labels"][i] >= 0)] or [0.0])
         for i in range(len(lengths))]
  np.testing.assert_allclose(l1, np.mean(per), rtol=1e-5)
  _assert_same_loss_and_grads((l2, g2), (l1, g1))


def test_refusals(setup, tmp_path):
  task, cfg = setup
  with pytest.raises(ValueError, match=r"^config\.data\.pack=4 with config"
                     r"\.lm_aux_weight > 0"):
    spec_lib.for_task(task, cfg, T, lm_head=True, pack=4)
  with pytest.raises(ValueError, match=r"task 'race/middle' does not pack"):
    spec_lib.pack_for(_race(), 4, False)
  with pytest.raises(ValueError, match=r"^config\.data\.pack=4 on a causal "
                     r"model: its classifier reads each example's last"):
    spec_lib.pack_for(task, 4, False, causal=True)
  for bad in (1, -2, 256, 2.5, True, "8"):
    with pytest.raises(ValueError, match=r"must be 0 \(one example per row\)"):
      packing.check_pack(bad)
  assert packing.check_pack(0) == 0 and packing.check_pack(8) == 8
  assert single_label.SingleLabelTask.packable


def test_unset_pack_packs_where_rows_can_and_nowhere_else(setup, tagger):
  """config.data.pack unset (the default): DEFAULT_PER_ROW a row for an
  encoder's classification, regression or tagging, one a row for tasks,
  heads and models whose rows cannot pack, which an explicit K would be
  refused."""
  task, _ = setup
  assert packing.DEFAULT_PER_ROW == 8
  assert spec_lib.pack_for(task, None, False) == 8
  assert spec_lib.pack_for(task, 0, False) == 0
  assert spec_lib.pack_for(task, 3, False) == 3
  assert spec_lib.pack_for(task, None, True) == 0  # the next-token loss
  assert spec_lib.pack_for(task, None, False, causal=True) == 0
  assert spec_lib.pack_for(tagger, None, False) == 8
  assert spec_lib.pack_for(_race(), None, False) == 0
  assert packing.check_pack(None) is None
  # A reloaded model: the same rule, and the same refusal, in one line.
  _, cfg = setup
  rows = predict_lib.inputs_per_row
  assert rows("classification", cfg, None) == 8
  assert rows("regression", cfg, 0) == 0
  assert rows("token_classification", cfg, None) == 8
  assert rows("multiple_choice", cfg, None) == 0
  assert rows("classification", dataclasses.replace(cfg, causal=True),
              None) == 0
  with pytest.raises(PredictError, match=r"^pack=4: a multiple_choice "
                     r"model reads one input a row; predict with pack=0\.$"):
    rows("multiple_choice", cfg, 4)
  with pytest.raises(PredictError, match=r"^pack=1 must be 0 \(one input a "
                     r"row\) or K in \[2, 255\] inputs a row\.$"):
    rows("classification", cfg, 1)


@pytest.mark.parametrize("name", ["classify", "glue", "squad", "race", "ner",
                                  "choice"])
def test_every_fine_tuning_config_takes_data_pack(name):
  """`--config.data.pack=K` (the README's) overrides a field every
  fine-tuning config has, unset by default (packed where rows can hold
  several examples): a locked config refuses keys it lacks."""
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(CONFIGS, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.lock()
  assert config.data.pack is None
  config.data.pack = 8
  assert config.data.pack == 8


WORDS = ("alpha", "beta", "gamma", "delta", "red", "green", "blue", "one",
         "two", "three")


def test_a_packed_fine_tune_reports_its_padding_and_predicts_in_order(
    tmp_path, tiny_spm, capsys):
  """The files task fine-tuned with data.pack=4 and without: the packed
  run's batches are mostly text (its own metrics say so), it reports real
  examples per second, and its prediction files list the eval rows in
  their order, as the unpacked run's do."""
  rng = np.random.default_rng(0)
  rows = [(" ".join(rng.choice(WORDS, rng.integers(2, 6))), "ab"[i % 2])
          for i in range(40)]
  for name, part in (("train", rows[:32]), ("eval", rows[32:])):
    (tmp_path / f"{name}.tsv").write_text(
        "text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in part))

  def run(pack):
    c = config_lib.finetune_config(
        "files", learning_rate=1e-3, batch_size=8, num_train_steps=8,
        warmup_steps=1, max_seq_length=32, dropout=0.0)
    for k, v in config_lib.tiny_model(vocab_size=300,
                                      max_position_embeddings=32).items():
      c.model[k] = v
    c.data.tokenizer = tiny_spm
    c.data.update(train_file=str(tmp_path / "train.tsv"),
                  eval_file=str(tmp_path / "eval.tsv"),
                  text_column="text", label_column="label", pack=pack)
    c.log_every_steps = 1
    c.eval_every_steps = c.checkpoint_every_steps = 4
    c.async_checkpoints = False
    c.fast_compile = True
    work = tmp_path / f"work{pack}"
    result = ft.run(c, str(work))
    lines = [json.loads(l) for l in (work / "tensorboard" / "metrics.jsonl").read_text(
        ).splitlines()]
    train = [l for l in lines if "train/padding_fraction" in l]
    assert len(train) == 8
    preds = sorted((work / "predictions").glob("*eval*"))
    return result, train, preds[0].read_text().splitlines()

  one, one_train, one_preds = run(0)
  many, many_train, many_preds = run(4)
  def padding(train):
    return sum(l["train/padding_fraction"] for l in train) / len(train)
  assert padding(one_train) > 0.45  # 2-5 words of 32
  assert padding(many_train) < 0.3
  # batch_size counts examples either way: 8 rows of one, or the 2-3 rows
  # of up to 4 that hold 8 on average (32 examples: 8 steps are 2 epochs).
  assert [l["train/examples"] for l in one_train] == [8.0] * 8
  examples = [l["train/examples"] for l in many_train]
  assert sum(examples) / 8 == pytest.approx(8, abs=2), examples
  ratio = [l["train/seq_per_sec"] / l["train/examples_per_sec"]
           for l in many_train]
  assert max(ratio) < 1, ratio  # fewer rows than examples, every step
  assert many_train[-1]["train/examples_per_sec"] > 0
  assert len(many_preds) == len(one_preds) == 9  # a header and 8 rows
  # Row order is the eval file's: row numbers and gold labels line for line.
  assert [l.split("\t")[0::2] for l in many_preds] == [
      l.split("\t")[0::2] for l in one_preds]
  assert "eval_accuracy" in many and "eval_accuracy" in one

  # The reloaded model packs its inputs too (unless told pack=0), and each
  # input's outputs are its outputs alone, in input order.
  work = str(tmp_path / "work4")
  packed, single = predict_lib.load(work), predict_lib.load(work, pack=0)
  assert (packed.pack, single.pack) == (packing.DEFAULT_PER_ROW, 0)
  shapes = []
  apply = packed._apply  # pylint: disable=protected-access
  packed._apply = lambda p, b: (  # pylint: disable=protected-access
      shapes.append((b["input_ids"].shape, packing.CLS in b)), apply(p, b))[1]
  texts = [t for t, _ in rows]
  got, want = packed.predict(texts), single.predict(texts)
  np.testing.assert_allclose([g["logits"] for g in got],
                             [w["logits"] for w in want], atol=1e-5)
  assert [g["label"] for g in got] == [w["label"] for w in want]
  # 40 texts of 2-5 words, up to 8 in a row of 32: one forward pass of
  # packed rows, where one a row would take two batches of 32.
  assert [s[1] for s in shapes] == [True] and shapes[0][0][0] <= 32
  inputs = tmp_path / "in.tsv"
  inputs.write_text("text\n" + "".join(f"{t}\n" for t in texts))
  out = tmp_path / "out.jsonl"
  assert prediction_files.main(["--model", work, "--input", str(inputs),
                             "--output", str(out), "--no_progress"]) == 0
  assert [json.loads(l)["label"] for l in out.read_text().splitlines()] == [
      w["label"] for w in want]
  assert prediction_files.main(["--model", work, "--input", str(inputs),
                             "--output", str(out), "--pack", "1"]) == 2
  assert "error: pack=1 must be 0 (one input a row) or K in [2, 255]" in (
      capsys.readouterr().err)
