"""Tests for albert_jax.finetune.tasks.classification.glue (and the shared head in
single_label.py), on TFDS's mock data: features, head, losses, metrics and
submission files."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax.finetune.tasks.classification import single_label
from albert_jax.finetune.tasks.classification import glue
from albert_jax.finetune import task as task_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives

tfds = pytest.importorskip("tensorflow_datasets")
tf = pytest.importorskip("tensorflow")

VOCAB, SEQ = 300, 32


@pytest.fixture(name="tok", scope="module")
def fixture_tok(tiny_tokenizer):
  """conftest's 300-piece SentencePiece model."""
  assert tiny_tokenizer.vocab_size == VOCAB
  return tiny_tokenizer


def _config(**overrides):
  values = dict(vocab_size=VOCAB, embedding_size=16, hidden_size=32,
                num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=SEQ,
                hidden_dropout_prob=0.1, classifier_dropout_prob=0.1)
  return ModelConfig(**{**values, **overrides})


def _fake_glue(tables):
  """A TFDS `as_dataset` serving hand-made rows per (config, split)."""
  def as_dataset(self, *args, split, **kwargs):
    del args, kwargs
    rows = tables[(self.builder_config.name, str(split))]
    label_dtype = (np.float32 if self.builder_config.name == "stsb"
                   else np.int64)
    columns = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    columns["label"] = columns["label"].astype(label_dtype)
    columns["idx"] = columns["idx"].astype(np.int32)
    return tf.data.Dataset.from_tensor_slices(columns)
  return as_dataset


def _load(task, split, tok, tables=None, num_examples=4):
  if tables is None:
    with tfds.testing.mock_data(num_examples=num_examples):
      return task.load(split, tok, SEQ)
  with tfds.testing.mock_data(as_dataset_fn=_fake_glue(tables)):
    return task.load(split, tok, SEQ)


################################################################################
# Task definitions.
################################################################################


def test_task_table():
  expected = {  # name: (metric, eval splits, predict splits, labels)
      "cola": ("mcc", ("validation",), ("test",), 2),
      "sst2": ("accuracy", ("validation",), ("test",), 2),
      "mrpc": ("f1", ("validation",), ("test",), 2),
      "qqp": ("f1", ("validation",), ("test",), 2),
      "stsb": ("pearson", ("validation",), ("test",), None),
      "mnli": ("accuracy", ("validation_matched", "validation_mismatched"),
               ("test_matched", "test_mismatched"), 3),
      "qnli": ("accuracy", ("validation",), ("test",), 2),
      "rte": ("accuracy", ("validation",), ("test",), 2),
      "wnli": ("accuracy", ("validation",), ("test",), 2),
      "ax": ("accuracy", ("validation_matched", "validation_mismatched"),
             ("ax",), 3),
  }
  for short, (metric, evals, predicts, labels) in expected.items():
    task = glue.make_task(f"glue/{short}", {})
    assert (task.name, task.metric, task.eval_splits, task.predict_splits) == (
        f"glue/{short}", metric, evals, predicts)
    assert task.regression == (labels is None)
    if labels:
      assert task.num_labels == labels
  assert glue.make_task("glue/mnli", {"glue_ax": True}).predict_splits == (
      "test_matched", "test_mismatched", "ax")
  with pytest.raises(ValueError, match=r"glue/sst-2.*choose one of.*glue/sst2"):
    glue.make_task("glue/sst-2", {})
  with pytest.raises(ValueError, match="has no split 'test_matched'"):
    glue.make_task("glue/rte", {}).load("test_matched", None, SEQ)


################################################################################
# Features.
################################################################################


def _expected_row(tok, a, b, length):
  ids = [tok.cls_id] + tok.encode(a) + [tok.sep_id]
  types = [0] * len(ids)
  if b is not None:
    ids += tok.encode(b) + [tok.sep_id]
    types += [1] * (len(ids) - len(types))
  pad = length - len(ids)
  return ids + [tok.pad_id] * pad, types + [0] * pad, [1] * len(types) + [0] * pad


def test_features_exact_sorted_by_idx_and_truncated(tok):
  long_text = " ".join(["the people of the united states"] * 6)
  rows = [
      {"sentence1": "The cat sat.", "sentence2": "A cat sat down.",
       "label": 1, "idx": 5},
      {"sentence1": "Hello world", "sentence2": "Goodbye world",
       "label": 0, "idx": 2},
      {"sentence1": long_text, "sentence2": "war", "label": 1, "idx": 9},
  ]
  task = glue.make_task("glue/mrpc", {})
  split = _load(task, "validation", tok, {("mrpc", "validation"): rows})
  assert split.name == "validation" and split.has_labels
  np.testing.assert_array_equal(split.examples.idx, [2, 5, 9])
  assert split.examples.file is None
  f = split.features
  assert sorted(f) == ["attention_mask", "input_ids", "labels",
                       "token_type_ids"]
  for key in task_lib.INPUT_KEYS:
    assert f[key].dtype == np.int32 and f[key].shape == (3, SEQ)
  assert f["labels"].dtype == np.int32
  np.testing.assert_array_equal(f["labels"], [0, 1, 1])
  for i, row in enumerate([rows[1], rows[0]]):
    ids, types, mask = _expected_row(tok, row["sentence1"], row["sentence2"],
                                     SEQ)
    assert f["input_ids"][i].tolist() == ids
    assert f["token_type_ids"][i].tolist() == types
    assert f["attention_mask"][i].tolist() == mask
  # Longest-first: "war" keeps its pieces, the long sentence gets the rest.
  war = tok.encode("war")
  kept = SEQ - 3 - len(war)
  assert f["input_ids"][2].tolist() == (
      [tok.cls_id] + tok.encode(long_text)[:kept] + [tok.sep_id] + war +
      [tok.sep_id])
  assert f["attention_mask"][2].sum() == SEQ


def test_single_sentence_regression_and_test_splits(tok):
  cola = glue.make_task("glue/cola", {})
  split = _load(cola, "test", tok, {("cola", "test"): [
      {"sentence": "Colorless green ideas.", "label": -1, "idx": 1},
      {"sentence": "Sleep furiously.", "label": -1, "idx": 0}]})
  assert not split.has_labels and split.examples.file == "CoLA.tsv"
  ids, types, mask = _expected_row(tok, "Sleep furiously.", None, SEQ)
  assert split.features["input_ids"][0].tolist() == ids
  assert split.features["token_type_ids"][0].tolist() == types
  np.testing.assert_array_equal(split.features["labels"], [-1, -1])

  stsb = glue.make_task("glue/stsb", {})
  split = _load(stsb, "train", tok, {("stsb", "train"): [
      {"sentence1": "a", "sentence2": "b", "label": 3.8, "idx": 0}]})
  assert split.features["labels"].dtype == np.float32
  np.testing.assert_allclose(split.features["labels"], [3.8])


@pytest.mark.parametrize("name", sorted(glue.SPECS))
def test_every_task_loads_mock_data(tok, name):
  task = glue.make_task(f"glue/{name}", {})
  for split_name in (task.train_split,) + task.eval_splits + (
      task.predict_splits[:1]):
    split = _load(task, split_name, tok, num_examples=3)
    assert split.num_rows == 3
    assert split.features["input_ids"].shape == (3, SEQ)
    assert (split.features["input_ids"][:, 0] == tok.cls_id).all()
    assert np.all(np.diff(split.examples.idx) >= 0)
    assert split.has_labels == (split_name not in task.predict_splits)


def test_ax_split_reads_glue_ax(tok):
  task = glue.make_task("glue/ax", {})
  split = _load(task, "ax", tok, {("ax", "test"): [
      {"premise": "p", "hypothesis": "h", "label": -1, "idx": 0}]})
  assert split.examples.file == "AX.tsv" and not split.has_labels


def test_reordered_tfds_labels_are_refused(tok):
  spec = dataclasses.replace(glue.SPECS["cola"],
                             label_names=("acceptable", "unacceptable"))
  task = glue.GlueTask("glue/cola", spec, {}, ("test",))
  with pytest.raises(ValueError, match="orders them differently"):
    _load(task, "test", tok)


################################################################################
# Head, losses and predictions on the model.
################################################################################


def test_model_head_losses_and_predictions(tok, fast_compile):
  task = glue.make_task("glue/mnli", {})
  split = _load(task, "train", tok, num_examples=4)
  cfg = _config()
  model = task_lib.FineTuneModel(cfg, task.head(cfg))
  batch = dict(split.features, weights=np.ones(4, np.float32))
  # Eager init of even this model takes half a minute on CPU; jit is quick.
  variables = jax.jit(lambda key: model.init(key, batch, deterministic=True),
                      compiler_options=fast_compile)(jax.random.key(0))
  kernel = variables["params"]["head"]["classifier"]["kernel"]
  assert kernel.value.shape == (32, 3)
  assert kernel.names == ("embed", "classes")
  params = nn.unbox(variables)

  def forward(params, batch, rng):
    det = model.apply(params, batch, deterministic=True)
    drop = model.apply(params, batch, deterministic=False,
                       rngs={"dropout": rng})
    return det, drop, task.loss_sums(det, batch), task.predict(det, batch)

  forward = jax.jit(forward, compiler_options=fast_compile)
  det, drop, sums, pred = forward(params, batch, jax.random.key(1))
  logits = np.asarray(det["logits"])
  assert logits.shape == (4, 3) and logits.dtype == np.float32
  assert not np.allclose(logits, np.asarray(drop["logits"]))
  labels = split.features["labels"]
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(
      sums["loss_sum"], -log_probs[np.arange(4), labels].sum(), rtol=1e-5)
  assert pred["prediction"].dtype == jnp.int32
  np.testing.assert_array_equal(pred["prediction"], logits.argmax(-1))
  assert sums["correct_sum"] == np.sum(logits.argmax(-1) == labels)


def test_regression_head_and_its_dropout_rate(fast_compile):
  task = glue.make_task("glue/stsb", {})
  encoded = {"pooled_output": jax.random.normal(jax.random.key(0), (4, 32))}
  batch = {"labels": jnp.array([0.0, 1.0, 2.5, 5.0]),
           "weights": jnp.array([1.0, 1.0, 1.0, 0.0])}

  def run(cfg):
    head = task.head(cfg)
    def fn(key):
      params = head.init(key, encoded, batch, True)
      det = head.apply(params, encoded, batch, True)
      drop = head.apply(params, encoded, batch, False,
                        rngs={"dropout": jax.random.key(2)})
      return det, drop, task.loss_sums(det, batch), task.predict(det, batch)
    return jax.jit(fn, compiler_options=fast_compile)(jax.random.key(1))

  det, drop, sums, pred = run(_config())
  assert det["logits"].shape == (4, 1)
  assert not np.allclose(det["logits"], drop["logits"])
  values = np.asarray(det["logits"])[:, 0]
  np.testing.assert_array_equal(pred["prediction"], values)
  np.testing.assert_allclose(
      sums["loss_sum"], np.sum((values[:3] - [0.0, 1.0, 2.5]) ** 2),
      rtol=1e-6)
  # The head's dropout is classifier_dropout_prob, not hidden_dropout_prob.
  det, drop, _, _ = run(_config(classifier_dropout_prob=0.0,
                                hidden_dropout_prob=0.5))
  np.testing.assert_array_equal(det["logits"], drop["logits"])


def test_zero_weight_rows_change_nothing(fast_compile):
  logits = jnp.array([[2.0, -1.0, 0.5], [0.0, 3.0, 1.0], [9.0, 9.0, 9.0]])
  labels = jnp.array([0, 2, 1])
  weights = jnp.array([1.0, 0.5, 0.0])
  cross_entropy = jax.jit(objectives.weighted_cross_entropy,
                          compiler_options=fast_compile)
  sums = cross_entropy(logits, labels, weights)
  # A padding row's logits (even NaN) and label (even -1) do not count.
  other = cross_entropy(logits.at[2].set(jnp.nan), labels.at[2].set(-1),
                        weights)
  log_probs = jax.nn.log_softmax(logits[:2])
  expected = -(log_probs[0, 0] * 1.0 + log_probs[1, 2] * 0.5)
  for s in (sums, other):
    np.testing.assert_allclose(s["loss_sum"], expected, rtol=1e-6)
    assert s["correct"] == 1.0 and s["weight"] == 1.5
  reg = jax.jit(single_label.squared_error_sums,
                compiler_options=fast_compile)(
      jnp.array([1.0, 2.0, jnp.nan]), jnp.array([0.5, 4.0, 1.0]), weights)
  np.testing.assert_allclose(reg["loss_sum"], 0.25 + 0.5 * 4.0)


################################################################################
# Metrics and files.
################################################################################


def _split(task, name, idx, labels, tok):
  spec_split = "test" if name == "ax" else name
  config = "ax" if name == "ax" else task.spec.tfds_name.split("/")[1]
  texts = {k: "x" for k in task.spec.texts}
  rows = [dict(texts, label=y, idx=i) for i, y in zip(idx, labels)]
  return _load(task, name, tok, {(config, spec_split): rows})


def test_evaluate_exact(tok):
  cola = glue.make_task("glue/cola", {})
  split = _split(cola, "validation", [0, 1, 2, 3, 4, 5],
                 [1, 0, 0, 1, 1, 0], tok)
  result = cola.evaluate({"prediction": np.array([1, 1, 0, 1, 0, 0])}, split)
  assert result == pytest.approx({"mcc": 1 / 3, "accuracy": 4 / 6})
  mrpc = glue.make_task("glue/mrpc", {})
  split = _split(mrpc, "validation", [3, 1, 2, 0], [1, 1, 0, 0], tok)
  # Rows are in idx order: labels [0, 1, 0, 1]; tp=1 fp=1 fn=1.
  result = mrpc.evaluate({"prediction": np.array([1, 1, 0, 0])}, split)
  assert result == {"accuracy": 0.5, "f1": 0.5, "accuracy_f1_mean": 0.5}
  stsb = glue.make_task("glue/stsb", {})
  split = _split(stsb, "validation", [0, 1, 2], [1.0, 3.0, 2.0], tok)
  result = stsb.evaluate({"prediction": np.array([1.0, 2.0, 3.0])}, split)
  assert result == pytest.approx({"pearson": 0.5, "spearman": 0.5,
                                  "pearson_spearman_mean": 0.5,
                                  "mse": 2 / 3})
  mnli = glue.make_task("glue/mnli", {})
  split = _split(mnli, "validation_mismatched", [0, 1, 2, 3], [0, 1, 2, 2],
                 tok)
  assert mnli.evaluate({"prediction": np.array([0, 1, 1, 2])}, split) == {
      "accuracy": 0.75}
  with pytest.raises(ValueError, match="has 4 rows but the predictions"):
    mnli.evaluate({"prediction": np.array([0, 1, 1])}, split)


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def test_submission_files(tok, tmp_path):
  mnli = glue.make_task("glue/mnli", {})
  split = _split(mnli, "test_matched", [2, 0, 1], [-1, -1, -1], tok)
  paths = mnli.write_predictions({"prediction": np.array([0, 2, 1])}, split,
                                 str(tmp_path))
  assert paths == [str(tmp_path / "MNLI-m.tsv")]
  assert _read(paths[0]) == ("index\tprediction\n0\tentailment\n"
                             "1\tcontradiction\n2\tneutral\n")
  split = _split(mnli, "test_mismatched", [0], [-1], tok)
  paths = mnli.write_predictions({"prediction": np.array([1])}, split,
                                 str(tmp_path))
  assert _read(tmp_path / "MNLI-mm.tsv") == "index\tprediction\n0\tneutral\n"
  split = _split(mnli, "ax", [0, 1], [-1, -1], tok)
  mnli.write_predictions({"prediction": np.array([2, 0])}, split,
                         str(tmp_path))
  assert _read(tmp_path / "AX.tsv") == (
      "index\tprediction\n0\tcontradiction\n1\tentailment\n")

  rte = glue.make_task("glue/rte", {})
  split = _split(rte, "test", [0, 1], [-1, -1], tok)
  rte.write_predictions({"prediction": np.array([1, 0])}, split,
                        str(tmp_path))
  assert _read(tmp_path / "RTE.tsv") == (
      "index\tprediction\n0\tnot_entailment\n1\tentailment\n")

  stsb = glue.make_task("glue/stsb", {})
  split = _split(stsb, "test", [0, 1, 2], [-1.0] * 3, tok)
  stsb.write_predictions({"prediction": np.array([-0.5, 2.25, 7.0])}, split,
                         str(tmp_path))
  assert _read(tmp_path / "STS-B.tsv") == (
      "index\tprediction\n0\t0.000000\n1\t2.250000\n2\t5.000000\n")
  split = _split(stsb, "validation", [0, 1], [4.0, 0.5], tok)
  paths = stsb.write_predictions({"prediction": np.array([5.5, 0.25])}, split,
                                 str(tmp_path))
  assert paths == [str(tmp_path / "validation_predictions.tsv")]
  assert _read(paths[0]) == ("idx\tprediction\tlabel\n0\t5.500000\t4.000000\n"
                             "1\t0.250000\t0.500000\n")

  for short, file in (("cola", "CoLA.tsv"), ("sst2", "SST-2.tsv"),
                      ("mrpc", "MRPC.tsv"), ("qqp", "QQP.tsv"),
                      ("qnli", "QNLI.tsv"), ("wnli", "WNLI.tsv")):
    task = glue.make_task(f"glue/{short}", {})
    split = _split(task, "test", [1, 0], [-1, -1], tok)
    task.write_predictions({"prediction": np.array([1, 0])}, split,
                           str(tmp_path))
    shown = ("not_entailment", "entailment") if short == "qnli" else ("1", "0")
    assert _read(tmp_path / file) == (
        f"index\tprediction\n0\t{shown[0]}\n1\t{shown[1]}\n")

  mnli_eval = _split(mnli, "validation_matched", [1, 0], [2, 0], tok)
  mnli.write_predictions({"prediction": np.array([0, 0])}, mnli_eval,
                         str(tmp_path))
  assert _read(tmp_path / "validation_matched_predictions.tsv") == (
      "idx\tprediction\tlabel\n0\tentailment\tentailment\n"
      "1\tentailment\tcontradiction\n")


def test_tfds_settings_are_read_once_with_their_defaults(tmp_path):
  """Every TFDS task reads data.tfds_data_dir and data.tfds_download the same
  way (finetune/tfds_source.py): defaults None and True, a path kept as
  given (local or gs://), download as a bool."""
  from albert_jax.finetune.tfds_source import TfdsSource  # pylint: disable=g-import-not-at-top
  assert TfdsSource.from_data({}) == TfdsSource(None, True)
  given = {"tfds_data_dir": str(tmp_path), "tfds_download": 0}
  assert TfdsSource.from_data(given) == TfdsSource(str(tmp_path), False)
  assert TfdsSource.from_data(
      {"tfds_data_dir": "gs://b/tfds"}).data_dir == "gs://b/tfds"
