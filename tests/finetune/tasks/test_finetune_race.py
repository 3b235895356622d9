"""Tests for RACE fine-tuning: features (through TFDS's mock), the
multiple-choice head and loss, accuracy per level and the predictions file."""

import importlib.util

import flax.linen as nn
import jax
from locations import CONFIGS
import tfds_fakes  # pylint: disable=g-bad-import-order
import numpy as np
import pytest

from albert_jax.finetune.tasks.multiple_choice import choices
from albert_jax.finetune.tasks.multiple_choice import race
from albert_jax.finetune import task as task_lib
from albert_jax.model.config import ModelConfig
from albert_jax.finetune.tfds_source import TfdsSource

tfds = pytest.importorskip("tensorflow_datasets")
pytest.importorskip("tensorflow")  # tfds_fakes serves through tf.data

SEQ = 40

ARTICLES = {
    "high": [{
        "example_id": "high1.txt",
        "article": ("The committee met in Washington in December to discuss "
                    "the budget of the nation and the price of grain."),
        "questions": ["Where did the committee meet?",
                      "The committee discussed _ ."],
        "options": [["In Boston", "In Washington", "In Paris", "At home"],
                    ["the weather", "a war", "the budget", "music"]],
        "answers": ["B", "C"]}],
    "middle": [{
        "example_id": "middle7.txt",
        "article": "Tom has a red bicycle. He rides it to school every day.",
        "questions": ["What color is the bicycle?"],
        "options": [["blue", "red", "green", "black"]],
        "answers": ["B"]}],
}


@pytest.fixture(name="tok", scope="module")
def fixture_tok(tiny_tokenizer):
  """conftest's 300-piece SentencePiece model."""
  return tiny_tokenizer


def _fake_race(articles=None):
  """A TFDS `as_dataset` serving hand-made articles per level (config)
  through the builder's own serialisation."""
  articles = ARTICLES if articles is None else articles
  return tfds_fakes.serving(
      lambda builder, split: articles[builder.builder_config.name])


def _load(task, tok, split="dev", articles=None, seq=SEQ):
  with tfds.testing.mock_data(as_dataset_fn=_fake_race(articles)):
    return task.load(split, tok, seq)


def test_make_task():
  with pytest.raises(ValueError, match=r"race/high.*race/middle.*race/all"):
    race.make_task("race/low", {})
  with pytest.raises(ValueError, match="max_qa_length"):
    race.make_task("race/high", {"max_qa_length": 0})
  task = race.make_task("race/all", {})
  assert (task.metric, task.train_split, task.eval_splits,
          task.predict_splits, task.max_qa_length) == (
              "accuracy", "train", ("dev",), ("dev", "test"), 128)


@pytest.mark.parametrize("subset", ["all", "high", "middle"])
def test_the_race_config_makes_the_task(subset):
  spec = importlib.util.spec_from_file_location(
      "race_config", CONFIGS / "race.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  data = module.get_config(f"subset={subset}").data
  task = race.make_task(data.task, data)
  assert task.name == f"race/{subset}"
  assert task.levels == (("middle", "high") if subset == "all" else (subset,))
  assert (task.max_qa_length, task.source) == (128, TfdsSource(None, True))


def test_qa_text():
  assert choices.qa_text("The committee discussed _ .", "the budget") == (
      "The committee discussed the budget .")
  assert choices.qa_text("Where?", "In Paris") == "Where? In Paris"


def test_features(tok):
  task = race.make_task("race/high", {"max_qa_length": 6})
  split = _load(task, tok)
  f = split.features
  assert f["input_ids"].shape == (2, 4, SEQ)
  for key in ("input_ids", "token_type_ids", "attention_mask", "label"):
    assert f[key].dtype == np.int32
  np.testing.assert_array_equal(f["label"], [1, 2])
  assert split.examples["ids"] == ["high1.txt-0", "high1.txt-1"]
  a = ARTICLES["high"][0]
  article = tok.encode(a["article"])
  for q in range(2):
    for c in range(4):
      # The question+option keeps its last 6 tokens; the article fills the
      # remaining SEQ - 3 - len(qa).
      qa = tok.encode(choices.qa_text(a["questions"][q], a["options"][q][c]))[-6:]
      context = article[:SEQ - 3 - len(qa)]
      expected = [tok.cls_id] + context + [tok.sep_id] + qa + [tok.sep_id]
      n = len(expected)
      np.testing.assert_array_equal(f["input_ids"][q, c, :n], expected)
      assert (f["input_ids"][q, c, n:] == tok.pad_id).all()
      np.testing.assert_array_equal(
          f["token_type_ids"][q, c],
          [0] * (len(context) + 2) + [1] * (len(qa) + 1) + [0] * (SEQ - n))
      np.testing.assert_array_equal(f["attention_mask"][q, c],
                                    [1] * n + [0] * (SEQ - n))
  assert len(article) > SEQ  # so the article really was cut


def test_all_reads_middle_then_high(tok):
  task = race.make_task("race/all", {"max_qa_length": 6})
  split = _load(task, tok, split="test")
  assert split.examples["ids"] == ["middle7.txt-0", "high1.txt-0",
                                   "high1.txt-1"]
  assert list(split.examples["levels"]) == ["middle", "high", "high"]
  np.testing.assert_array_equal(split.features["label"], [1, 1, 2])


def test_bad_records_are_refused(tok):
  task = race.make_task("race/middle", {"max_qa_length": 6})
  bad = {"middle": [dict(ARTICLES["middle"][0], answers=["E"])]}
  with pytest.raises(ValueError, match="middle7.txt.*question 0.*'E'"):
    _load(task, tok, articles=bad)
  bad = {"middle": [dict(ARTICLES["middle"][0],
                         options=[["blue", "red", "green"]])]}
  with pytest.raises(ValueError, match="expected 4 options"):
    _load(task, tok, articles=bad)
  with pytest.raises(ValueError, match="max_qa_length"):
    _load(task, tok, seq=9)


def test_head_loss_and_predict(tok, fast_compile):
  task = race.make_task("race/all", {"max_qa_length": 6})
  split = _load(task, tok)
  # The features the spec builds the step from are what `load` gives.
  for name, (shape, dtype) in task.batch_features(SEQ).items():
    assert split.features[name].shape[1:] == shape, name
    assert split.features[name].dtype == dtype, name
  cfg = ModelConfig(vocab_size=tok.vocab_size, embedding_size=16,
                    hidden_size=32, num_hidden_layers=1,
                    num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                    classifier_dropout_prob=0.5)
  model = task_lib.FineTuneModel(cfg, task.head(cfg))
  batch = dict(split.features)
  batch["weights"] = np.array([1.0, 1.0, 0.0], np.float32)
  params = jax.jit(lambda r: model.init(r, batch, deterministic=True),
                   compiler_options=fast_compile)(jax.random.key(0))["params"]
  params = nn.meta.unbox(params)
  assert params["head"]["output"]["kernel"].shape == (32, 1)

  def run(params, batch, rng):
    train = model.apply({"params": params}, batch, deterministic=False,
                        rngs={"dropout": rng})
    infer = model.apply({"params": params}, batch, deterministic=True)
    return train, infer, task.loss_sums(infer, batch), task.predict(infer,
                                                                    batch)
  run = jax.jit(run, compiler_options=fast_compile)
  train, infer, sums, preds = run(params, batch, jax.random.key(1))
  assert infer["logits"].shape == (3, 4)
  # Dropout on the pooled output (p=0.5) changes the training logits.
  assert not np.allclose(train["logits"], infer["logits"])
  logits = np.asarray(infer["logits"], np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -log_probs[np.arange(3), batch["label"]]
  np.testing.assert_allclose(float(sums["loss_sum"]), nll[:2].sum(),
                             rtol=1e-5)
  correct = (logits.argmax(-1) == batch["label"])[:2].sum()
  assert float(sums["correct_sum"]) == correct
  np.testing.assert_array_equal(preds["prediction"], logits.argmax(-1))
  # A zero-weight row changes nothing.
  other = dict(batch, label=np.array([1, 1, 3], np.int32))
  other["input_ids"] = batch["input_ids"].copy()
  other["input_ids"][2] = tok.unk_id
  _, _, sums2, _ = run(params, other, jax.random.key(1))
  assert float(sums2["loss_sum"]) == pytest.approx(float(sums["loss_sum"]),
                                                   rel=1e-6)


def test_evaluate_and_file(tok, tmp_path):
  task = race.make_task("race/all", {"max_qa_length": 6})
  split = _load(task, tok)
  # Gold: middle B; high B, C. Predict B, D, C: middle 1/1, high 1/2.
  preds = {"prediction": np.array([1, 3, 2], np.int32)}
  assert task.evaluate(preds, split) == {
      "accuracy": pytest.approx(2 / 3), "accuracy_all": pytest.approx(2 / 3),
      "accuracy_middle": 1.0, "accuracy_high": 0.5}
  only_high = race.make_task("race/high", {"max_qa_length": 6})
  high_split = _load(only_high, tok)
  assert only_high.evaluate({"prediction": np.array([1, 2])}, high_split) == {
      "accuracy": 1.0}
  paths = task.write_predictions(preds, split, str(tmp_path))
  assert paths == [str(tmp_path / "dev_predictions.tsv")]
  with open(paths[0], encoding="utf-8") as f:
    assert f.read() == ("id\tlevel\tprediction\tlabel\n"
                        "middle7.txt-0\tmiddle\tB\tB\n"
                        "high1.txt-0\thigh\tD\tB\n"
                        "high1.txt-1\thigh\tC\tC\n")
