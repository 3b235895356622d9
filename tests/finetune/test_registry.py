"""The task registry: every family's names and task types, and a new family
as one folder plus one line of `registry.FAMILIES` (the README's recipe)."""

import sys
import textwrap

import pytest

import albert_jax
from albert_jax import config_lib
from albert_jax.finetune import registry
from albert_jax.finetune import run as ft
from albert_jax.finetune.serving import fine_tuned
from albert_jax.finetune.task_type import PredictError

# The README's example family, word for word.
FAMILY = '''
"""Product reviews: a JSONL file per split, "review" and "stars" (1-5)."""
from albert_jax.finetune.tasks.classification import files

TASKS = ("reviews/stars",)
TASK_TYPES = ()  # its models are classifiers, a type that exists


class StarsTask(files.FilesTask):
  name = "reviews/stars"


def make_task(name, data):
  data = dict(data, text_column="review", label_column="stars")
  return StarsTask(data)
'''


def test_every_family_names_its_tasks_and_types():
  names = registry.task_names()
  assert names[:2] == ("glue/cola", "glue/sst2")
  assert {"files", "race/all", "choice/files", "ner/files", "ner/conll2003",
          "squad/v1.1", "squad/v2.0"} <= set(names)
  assert len(names) == len(set(names))
  assert tuple(registry.task_types()) == (
      "classification", "regression", "multiple_choice",
      "question_answering", "token_classification")
  with pytest.raises(PredictError, match=r"^Unknown task_type 'tagging' in "):
    registry.task_type("tagging")


def test_a_transformers_class_names_its_task_type():
  kind = registry.task_type_of_hf
  assert kind("ForSequenceClassification", {}).name == "classification"
  assert kind("ForSequenceClassification",
              {"problem_type": "regression"}).name == "regression"
  assert kind("ForTokenClassification", {}).name == "token_classification"
  assert kind("ForMultipleChoice", {}).name == "multiple_choice"
  assert kind("ForQuestionAnswering", {}).name == "question_answering"
  assert kind("ForSomethingElse", {}) is None


def test_a_new_family_is_one_folder_and_one_registry_line(
    tmp_path, monkeypatch, tiny_spm):
  package = tmp_path / "my_tasks" / "reviews"
  package.mkdir(parents=True)
  (package.parent / "__init__.py").write_text("")
  (package / "__init__.py").write_text(textwrap.dedent(FAMILY))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(registry, "FAMILIES",
                      registry.FAMILIES + ("my_tasks.reviews",))
  registry._families.cache_clear()  # pylint: disable=protected-access
  try:
    assert registry.task_names()[-1] == "reviews/stars"
    with pytest.raises(ValueError, match=r"\(did you mean 'reviews/stars'\?"):
      registry.check_name("reviews/star")
    rows = ['{"review": "great value, works well", "stars": 5}',
            '{"review": "broke in a day", "stars": 1}',
            '{"review": "does the job", "stars": 4}',
            '{"review": "never again", "stars": 1}']
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "eval.jsonl").write_text("\n".join(rows[::-1][:3]) + "\n")
    c = config_lib.finetune_config(
        "reviews/stars", learning_rate=3e-3, batch_size=4, num_train_steps=2,
        warmup_steps=1, max_seq_length=16, dropout=0.0)
    c.model.update(config_lib.tiny_model(vocab_size=300,
                                         max_position_embeddings=16))
    c.data.update(tokenizer=tiny_spm, train_file=str(tmp_path / "train.jsonl"),
                  eval_file=str(tmp_path / "eval.jsonl"))
    c.eval_every_steps = c.checkpoint_every_steps = 2
    c.async_checkpoints, c.fast_compile = False, True
    result = ft.run(c, str(tmp_path / "work"))
    assert (result["task"], result["step"]) == ("reviews/stars", 2)
    assert 0 <= result["eval_accuracy"] <= 1
    model = fine_tuned.load(str(tmp_path / "work"))
    assert (model.task, model.task_type, model.labels) == (
        "reviews/stars", "classification", ("1", "4", "5"))
    out = model.predict(["works well"])
    assert len(out) == 1 and out[0]["label"] in ("1", "4", "5")
    # Exported as transformers' classifier, and read back as one.
    model.to_hf(str(tmp_path / "hf"))
    back = albert_jax.load_pretrained(str(tmp_path / "hf"))
    assert (back.task_type, back.labels) == ("classification", ("1", "4", "5"))
    assert back.predict(["works well"])[0]["label"] == out[0]["label"]
  finally:
    monkeypatch.undo()
    registry._families.cache_clear()  # pylint: disable=protected-access
    sys.modules.pop("my_tasks.reviews", None)
    sys.modules.pop("my_tasks", None)
