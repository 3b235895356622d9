"""Fine-tuned task heads exported to transformers' task classes agree with
them (≤ 1e-5 on logits at real positions), keep their label names, and load
back through `load_pretrained`; heads without a class are refused."""

import json

import jax
import numpy as np
import pytest

import albert_jax
from albert_jax import config_lib
from albert_jax.finetune.serving import fine_tuned as predict_lib
from albert_jax.model.config import ModelConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T = 12
FAMILIES = {
    "albert": dict(),
    "bert": dict(share="none", projection=False),
    "roberta": dict(share="none", projection=False,
                    position_ids_from_padding=True, pad_token_id=1),
    "electra": dict(share="none", projection=True),
}
TASKS = {  # task type → (labels, HF auto class)
    "classification": (("neg", "pos", "meh"),
                       "AutoModelForSequenceClassification"),
    "regression": (None, "AutoModelForSequenceClassification"),
    "token_classification": (("O", "B-PER", "I-PER"),
                             "AutoModelForTokenClassification"),
    "question_answering": (None, "AutoModelForQuestionAnswering"),
    "multiple_choice": (None, "AutoModelForMultipleChoice"),
}


def _model(family, task_type, tokenizer, compiler_options=None):
  cfg = ModelConfig.from_dict(config_lib.tiny_model(
      vocab_size=300, max_position_embeddings=T + 2, hidden_act="gelu",
      **FAMILIES[family]))
  labels = TASKS[task_type][0]
  settings = {"task_type": task_type, "labels": labels, "max_seq_length": T,
              "head_kind": "span", "text_columns": ["text"]}
  shape = (1, 3, T) if task_type == "multiple_choice" else (1, T)
  batch = {k: np.ones(shape, np.int32) for k in (
      "input_ids", "token_type_ids", "attention_mask")}
  batch["p_mask"] = np.zeros(shape, bool)
  module = predict_lib.spec_from_record(settings, cfg).model
  # One compiled program: op by op, a tiny model's init costs ~15 CPU s.
  params = jax.jit(module.init, compiler_options=compiler_options)(
      jax.random.key(1), batch)["params"]
  # Spread every parameter, so biases and LayerNorms are exercised too.
  leaves, treedef = jax.tree.flatten(jax.tree.map(np.asarray,
                                                  predict_lib._unbox(params)))
  rng = np.random.default_rng(0)
  leaves = [x + 0.1 * rng.standard_normal(x.shape).astype(x.dtype)
            for x in leaves]
  return predict_lib.FineTuned(
      task="t", task_type=task_type, labels=labels, model_config=cfg,
      params=jax.tree.unflatten(treedef, leaves), tokenizer=tokenizer,
      settings=settings)


def _inputs(task_type):
  rng = np.random.default_rng(3)
  lead = (2, 3) if task_type == "multiple_choice" else (2,)
  ids = rng.integers(5, 300, size=lead + (T,)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[0, ..., T - 4:] = 0
  ids[mask == 0] = 1  # the padding id of every family here
  types = np.zeros_like(ids)
  types[..., T // 2:] = mask[..., T // 2:]
  feats = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
  if task_type == "question_answering":
    feats["p_mask"] = np.zeros(ids.shape, bool)
  return feats


CASES = [(f, t) for f in FAMILIES for t in TASKS
         if not (f == "electra" and t in ("classification", "regression",
                                           "multiple_choice"))]


@pytest.mark.parametrize("family,task_type", CASES)
def test_export_matches_transformers_and_loads_back(family, task_type,
                                                    tmp_path,
                                                    tiny_tokenizer,
                                                    fast_compile):
  model = _model(family, task_type, tiny_tokenizer, fast_compile)
  model.to_hf(str(tmp_path))
  config = json.loads((tmp_path / "config.json").read_text())
  labels, auto = TASKS[task_type]
  if labels:
    assert config["id2label"] == {str(i): x for i, x in enumerate(labels)}
    assert config["label2id"] == {x: i for i, x in enumerate(labels)}
  ref = getattr(transformers, auto).from_pretrained(str(tmp_path)).eval()
  assert type(ref).__name__ == config["architectures"][0]
  feats = _inputs(task_type)
  ours = model(feats)
  with torch.no_grad():
    theirs = ref(**{k: torch.as_tensor(v, dtype=torch.long)
                    for k, v in feats.items() if k != "p_mask"})
  real = feats["attention_mask"] == 1
  if task_type == "question_answering":
    for key in ("start_logits", "end_logits"):
      diff = np.abs(ours[key] - getattr(theirs, key).numpy())[real]
      assert diff.max() <= 1e-5, key
  elif task_type == "token_classification":
    diff = np.abs(ours["logits"] - theirs.logits.numpy())[real]
    assert diff.max() <= 1e-5
  else:
    np.testing.assert_allclose(ours["logits"].reshape(theirs.logits.shape),
                               theirs.logits.numpy(), rtol=0, atol=1e-5)
  back = albert_jax.load_pretrained(str(tmp_path))
  assert (back.task_type, back.labels) == (task_type, labels)
  # The same parameters (the unused pooler of token and span heads aside).
  want = jax.tree.map(np.asarray, model.params)
  got = jax.tree.map(np.asarray, back.params)
  if task_type in ("token_classification", "question_answering"):
    want["albert"].pop("pooler"), got["albert"].pop("pooler")
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)


def test_heads_without_a_transformers_class_are_refused(tmp_path,
                                                         tiny_tokenizer,
                                                         fast_compile):
  model = _model("albert", "question_answering", tiny_tokenizer,
                 fast_compile)
  model.settings["head_kind"] = "official"
  with pytest.raises(ValueError, match=(
      r"^This model has ALBERT's official SQuAD v2\.0 head .* which no "
      r"transformers class holds; AlbertForQuestionAnswering is the plain "
      r"span head\.")):
    model.to_hf(str(tmp_path))
  model = _model("electra", "classification", tiny_tokenizer, fast_compile)
  with pytest.raises(ValueError, match=(
      r"^transformers' ElectraForSequenceClassification reads \[CLS\] "
      "through dense \\+ GELU")):
    model.to_hf(str(tmp_path))
