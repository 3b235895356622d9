"""The fine-tuning run on a toy task: training, eval, best checkpoint,
predictions, resume, accumulation, and starting from pre-trained weights."""

import json
import os
import shutil
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from albert_jax import config_lib
from albert_jax import sharding as sharding_lib
from albert_jax.finetune import batching
from albert_jax.finetune import registry
from albert_jax.finetune import run as ft
from albert_jax.finetune import starting_point as start_lib
from albert_jax.finetune import task as task_lib
from albert_jax.model import layers
from albert_jax.model.config import ModelConfig
from albert_jax.training import checkpoints
from albert_jax.training import state as state_lib

# Every run compiles the same few programs; the later runs read them back.

TOKENIZER = None  # set per test: a tokenizer of VOCAB pieces (below)
SEQ = 16
VOCAB = 50


@pytest.fixture(autouse=True)
def _tokenizer_of_the_models_size(spm_of_size, monkeypatch):
  """The toy model embeds VOCAB ids: its tokenizer has that many pieces
  (fine-tuning refuses a larger one)."""
  monkeypatch.setattr(sys.modules[__name__], "TOKENIZER", spm_of_size(VOCAB))


def toy_features(n, seed):
  """Label 1 iff token 7 fills every other position: learnable from scratch
  in a few steps."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(8, VOCAB, size=(n, SEQ)).astype(np.int32)
  labels = rng.integers(0, 2, size=n).astype(np.int32)
  ids[labels == 1, 1::2] = 7
  ids[:, 0] = 2
  mask = np.ones((n, SEQ), np.int32)
  mask[: n // 3, SEQ - 4:] = 0  # some padding
  return {"input_ids": ids, "token_type_ids": np.zeros_like(ids),
          "attention_mask": mask, "labels": labels}


class Head(nn.Module):
  config: object

  @nn.compact
  def __call__(self, encoded, batch, deterministic):
    del batch, deterministic
    return {"logits": layers.Dense((2,), ("embed", "classes"),
                                   name="out")(encoded["pooled_output"])}


class ToyTask(task_lib.Task):
  name = "toy"
  metric = "accuracy"
  eval_splits = ("validation",)
  predict_splits = ("test",)

  def __init__(self):
    self.loaded = []

  def load(self, split, tokenizer, max_seq_length):
    self.loaded.append(split)
    seed = {"train": 0, "validation": 1, "test": 2}[split]
    f = toy_features({"train": 64, "validation": 21, "test": 10}[split], seed)
    return task_lib.Split(split, f, has_labels=split != "test")

  def head(self, model_config):
    return Head(model_config)

  def loss_sums(self, outputs, batch):
    logits = outputs["logits"].astype(jnp.float32)
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits),
                              batch["labels"][:, None], axis=-1)[:, 0]
    correct = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
    return {"loss_sum": jnp.sum(ce * batch["weights"]),
            "correct_sum": jnp.sum(correct * batch["weights"])}

  def predict(self, outputs, batch):
    return {"label": jnp.argmax(outputs["logits"], -1)}

  def evaluate(self, predictions, split):
    return {"accuracy": float(np.mean(
        predictions["label"] == split.features["labels"]))}

  def write_predictions(self, predictions, split, directory):
    path = os.path.join(directory, f"{split.name}.txt")
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(str(int(p)) for p in predictions["label"]))
    return [path]


def toy_config(**overrides):
  c = config_lib.finetune_config(
      "toy", learning_rate=3e-3, batch_size=8, num_train_steps=24,
      warmup_steps=2, max_seq_length=SEQ, dropout=0.0)
  for k, v in config_lib.tiny_model(vocab_size=VOCAB,
                                    max_position_embeddings=SEQ).items():
    c.model[k] = v
  c.model.classifier_dropout_prob = 0.0
  c.data.tokenizer = TOKENIZER
  c.log_every_steps = 4
  c.eval_every_steps = c.checkpoint_every_steps = 8
  c.async_checkpoints = False
  c.fast_compile = True
  for k, v in overrides.items():
    node = c
    *parents, leaf = k.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = v
  return c


@pytest.fixture
def toy(monkeypatch):
  task = ToyTask()
  monkeypatch.setattr(registry, "make_task", lambda name, data: task)
  return task


def test_batches_are_a_function_of_the_step_and_cover_each_epoch():
  f = {"x": np.arange(10)}
  b = batching.ArrayBatches(f, 4, seed=3)
  again = batching.ArrayBatches(f, 4, seed=3)
  rows = np.concatenate([b.train_rows(s) for s in range(5)])
  np.testing.assert_array_equal(rows, np.concatenate(
      [again.train_rows(s) for s in range(5)]))
  # Steps 0-1 and half of 2 are epoch 0: each row exactly once.
  assert sorted(rows[:10]) == list(range(10))
  assert sorted(rows[10:20]) == list(range(10))
  assert not np.array_equal(rows[:10], rows[10:20])  # reshuffled per epoch
  np.testing.assert_array_equal(b.train_batch(4)["x"], rows[16:20])
  assert b.train_batch(0)["weights"].tolist() == [1.0] * 4


def test_eval_batches_pad_the_last_batch_with_zero_weight():
  b = batching.ArrayBatches({"x": np.arange(10) + 100}, 4)
  out = list(b.eval_batches())
  assert b.num_eval_batches == 3
  np.testing.assert_array_equal(out[2]["x"], [108, 109, 100, 100])
  np.testing.assert_array_equal(out[2]["weights"], [1, 1, 0, 0])
  assert all(o["weights"].dtype == np.float32 for o in out)


def test_empty_split_is_refused():
  with pytest.raises(ValueError, match="no rows"):
    batching.ArrayBatches({"x": np.zeros((0, 3))}, 4)


def test_run_trains_evaluates_keeps_best_and_writes_predictions(toy, tmp_path):
  result = ft.run(toy_config(), str(tmp_path))
  assert result["step"] == 24
  assert result["eval_accuracy"] >= 0.9, result
  assert toy.loaded == ["train", "validation", "test"]
  train_labels = toy_features(64, 0)["labels"]
  majority = np.argmax(np.bincount(train_labels))
  assert result["eval_majority_baseline_accuracy"] == np.mean(
      toy_features(21, 1)["labels"] == majority)
  assert not any(k.startswith("eval_test/") for k in result)  # unlabelled
  assert result["data"] == "toy"  # no file: the task's name
  with open(tmp_path / "final_metrics.json", encoding="utf-8") as f:
    assert json.load(f) == result
  # The best eval step's predictions are the ones written.
  assert result["best_step"] in (8, 16, 24)
  preds = (tmp_path / "predictions" / "test.txt").read_text().split("\n")
  assert len(preds) == 10 and set(preds) <= {"0", "1"}
  assert sorted(os.path.basename(p) for p in result["predictions"]) == [
      "test.txt", "validation.txt"]


class PeakTask(ToyTask):
  """The toy task with a scripted eval metric: its evaluations during
  training (steps 8, 16 and 24) score SCRIPT, so step 16 is the best, not
  the last. Every evaluation's predictions, logits included, are kept."""

  SCRIPT = (0.5, 0.9, 0.2)

  def __init__(self):
    super().__init__()
    self.evaluated = []

  def predict(self, outputs, batch):
    return {**super().predict(outputs, batch), "logits": outputs["logits"]}

  def evaluate(self, predictions, split):
    self.evaluated.append(predictions)
    metrics = super().evaluate(predictions, split)
    if len(self.evaluated) <= len(self.SCRIPT):
      metrics["accuracy"] = self.SCRIPT[len(self.evaluated) - 1]
    return metrics


def test_predictions_come_from_the_best_step_not_the_last(monkeypatch,
                                                           tmp_path):
  """The metric peaks mid-run: the best checkpoint's parameters are restored
  for the predictions and final metrics. With keep_checkpoints=1 only the
  best-metric retention keeps that checkpoint."""
  task = PeakTask()
  monkeypatch.setattr(registry, "make_task", lambda name, data: task)
  result = ft.run(toy_config(keep_checkpoints=1), str(tmp_path))
  assert (result["step"], result["best_step"]) == (24, 16)
  assert checkpoints.available_steps(str(tmp_path)) == [16, 24]
  # Evaluated at steps 8, 16 and 24, then once more with the best parameters.
  assert len(task.evaluated) == 4
  _, at_16, at_24, final = task.evaluated
  np.testing.assert_array_equal(final["logits"], at_16["logits"])
  assert not np.allclose(final["logits"], at_24["logits"], atol=1e-3)
  labels = toy_features(21, 1)["labels"]
  assert result["eval_accuracy"] == np.mean(at_16["label"] == labels)
  written = (tmp_path / "predictions" / "validation.txt").read_text()
  assert written.split("\n") == [str(int(p)) for p in at_16["label"]]
  with open(tmp_path / "final_metrics.json", encoding="utf-8") as f:
    assert json.load(f) == result


def test_resume_continues_to_the_same_parameters(toy, tmp_path):
  """A run that lost everything after its step-8 checkpoint resumes from it
  and ends where the uninterrupted run ended: batches depend only on
  (seed, step)."""
  config = toy_config(num_train_steps=12)
  full = ft.run(config, str(tmp_path))
  first = (tmp_path / "predictions" / "test.txt").read_text()
  shutil.rmtree(tmp_path / "checkpoints" / "12")
  shutil.rmtree(tmp_path / "predictions")
  resumed = ft.run(config, str(tmp_path))
  spent, spent_before = resumed.pop("goodput"), full.pop("goodput")
  assert resumed == full
  assert (tmp_path / "predictions" / "test.txt").read_text() == first
  # Steps 9-12 ran again, in a second session: lost progress.
  assert (spent_before["sessions"], spent_before["lost_steps"]) == (1, 0)
  assert (spent["sessions"], spent["lost_steps"]) == (2, 4)


def test_task_objective_accumulation_matches_one_batch(toy, fast_compile):
  """Sum-form loss: 4 micro-batches give the gradients of the whole batch."""
  cfg = toy_config()
  model_config = ModelConfig.from_dict(
      {k: v for k, v in cfg.model.items() if v is not None})
  model = task_lib.FineTuneModel(model_config, toy.head(model_config))
  objective = task_lib.TaskObjective(model, toy)
  batch = {**toy_features(8, 5), "weights": np.ones(8, np.float32)}
  batch["weights"][-2:] = 0.0  # padding rows count for nothing
  params = nn.meta.unbox(jax.jit(model.init, compiler_options=fast_compile)(
      jax.random.key(0), batch)["params"])

  def loss(p, b):
    dens = objective.denominators(batch)
    return objective.sums(p, b, None, True)["task_loss_sum"] / dens["task"]

  grad = jax.jit(jax.grad(loss), compiler_options=fast_compile)
  whole = grad(params, batch)
  parts = [grad(params, jax.tree.map(lambda x: x[i:i + 2], batch))
           for i in range(0, 8, 2)]
  summed = jax.tree.map(lambda *g: sum(g), *parts)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
      whole, summed)
  # And the zero-weight rows truly contribute nothing.
  sums = jax.jit(lambda p, b: objective.sums(p, b, None, True),
                 compiler_options=fast_compile)
  trimmed = jax.tree.map(lambda x: x[:6], batch)
  np.testing.assert_allclose(sums(params, batch)["task_loss_sum"],
                             sums(params, trimmed)["task_loss_sum"],
                             rtol=1e-6)


def test_init_places_pretrained_encoder_and_overrides_dropout(tmp_path,
                                                              fast_compile):
  """config.init: the checkpoint's embeddings/encoder/pooler land in
  params["albert"] unchanged; config.model overrides only what is set."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  torch.manual_seed(0)
  hf = transformers.AlbertForPreTraining(transformers.AlbertConfig(
      vocab_size=VOCAB, embedding_size=16, hidden_size=32,
      num_attention_heads=2, intermediate_size=48, num_hidden_layers=2,
      max_position_embeddings=SEQ, hidden_dropout_prob=0.3))
  hf.save_pretrained(str(tmp_path / "hf"))
  config = toy_config()
  for k in config.model.keys():  # back to "keep the checkpoint's"
    config.model[k] = None
  config.model.hidden_dropout_prob = 0.05
  config.init = str(tmp_path / "hf")
  model_config, encoder, _ = start_lib.encoder_start(
      start_lib.StartOptions.from_config(config))
  assert model_config.hidden_size == 32
  assert model_config.hidden_dropout_prob == 0.05
  assert set(encoder) == {"embeddings", "encoder", "pooler"}

  task = ToyTask()
  model = task_lib.FineTuneModel(model_config, task.head(model_config))
  tx = optax.sgd(0.1)
  example = {**toy_features(1, 0), "weights": np.ones(1, np.float32)}
  init = state_lib.state_init_fn(
      lambda r: model.init(r, example)["params"], tx)
  mesh = sharding_lib.make_mesh((("data", -1),))
  rules = sharding_lib.rules_for(mesh)
  state, shardings = state_lib.create_state(init, tx, mesh, rules,
                                            jax.random.key(0), fast_compile)
  placed = start_lib.place_encoder(state, shardings, encoder)
  for key in encoder:
    jax.tree.map(np.testing.assert_array_equal,
                 placed["params"]["albert"][key], encoder[key])
  # The head keeps its fresh initialisation.
  jax.tree.map(np.testing.assert_array_equal, placed["params"]["head"],
               state["params"]["head"])
  # A checkpoint of another width is refused with the mismatched paths.
  wide = jax.tree.map(lambda x: np.zeros(x.shape[:-1] + (x.shape[-1] + 1,)),
                      encoder)
  with pytest.raises(ValueError, match="do not fit the model.*embeddings"):
    start_lib.place_encoder(state, shardings, wide)

  # config.reinit_pooler: everything but the pooler comes from the
  # checkpoint; the pooler keeps its fresh values.
  config.reinit_pooler = True
  _, no_pooler, _ = start_lib.encoder_start(
      start_lib.StartOptions.from_config(config))
  assert set(no_pooler) == {"embeddings", "encoder"}
  placed = start_lib.place_encoder(state, shardings, no_pooler)
  fresh = state["params"]["albert"]["pooler"]
  jax.tree.map(np.testing.assert_array_equal,
               placed["params"]["albert"]["pooler"], fresh)
  assert not np.allclose(np.asarray(jax.tree.leaves(fresh)[-1]),
                         np.asarray(jax.tree.leaves(encoder["pooler"])[-1]))
  jax.tree.map(np.testing.assert_array_equal,
               placed["params"]["albert"]["encoder"], encoder["encoder"])
