"""A run's recipe is recorded and checked on resume (training/recipe.py)."""

import json
import os
import shutil

import pytest

from albert_jax.training import pretrain
from albert_jax.training import recipe as recipe_lib
from test_bad_inputs import snapshot  # pylint: disable=g-bad-import-order
from training.test_checkpoints import tiny_config


@pytest.fixture(name="run")
def fixture_run(tmp_path):
  """(config, workdir) of a recorded run whose corpus and tokenizer are
  files in tmp_path."""
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  (corpus / "a.txt").write_text("One sentence.\nAnother one.\n\n",
                                encoding="utf-8")
  (corpus / "b.txt").write_text("A third.\nA fourth.\n", encoding="utf-8")
  tokenizer = tmp_path / "spiece.model"
  tokenizer.write_bytes(b"tokenizer bytes " * 100)
  config = tiny_config()
  config.data.corpus = str(corpus / "*.txt")
  config.data.tokenizer = str(tokenizer)
  workdir = tmp_path / "workdir"
  workdir.mkdir()
  recipe_lib.record(config, str(workdir))
  return config, str(workdir)


def _refused(config, workdir, *expected):
  before = snapshot(workdir)
  with pytest.raises(recipe_lib.RecipeError) as error:
    recipe_lib.check(config, workdir)
  for text in expected:
    assert text in str(error.value), str(error.value)
  assert "start in a new workdir" in str(error.value)
  assert snapshot(workdir) == before
  return str(error.value)


def test_same_recipe_resumes(run):
  config, workdir = run
  recipe_lib.check(config, workdir)


def test_architecture_that_keeps_the_shapes_is_refused(run):
  config, workdir = run
  # share=all: four layers have exactly the parameters of two.
  config.model.num_hidden_layers = 4
  config.model.hidden_act = "gelu"
  message = _refused(config, workdir,
                     "model.num_hidden_layers: 2 → 4",
                     "model.hidden_act: 'gelu_new' → 'gelu'")
  assert message.count("\n  ") == 2  # exactly the two changed fields


def test_changed_corpus_and_tokenizer_are_refused(run):
  config, workdir = run
  corpus = os.path.dirname(config.data.corpus)
  with open(os.path.join(corpus, "b.txt"), "a", encoding="utf-8") as f:
    f.write("A fifth.\n")
  with open(config.data.tokenizer, "r+b") as f:
    f.write(b"another ")  # same size, other content
  _refused(config, workdir, "data.corpus: content changed",
           "data.tokenizer: content changed")


def test_a_corpus_file_more_is_refused(run):
  config, workdir = run
  corpus = os.path.dirname(config.data.corpus)
  (open(os.path.join(corpus, "c.txt"), "w", encoding="utf-8")
   .close())
  _refused(config, workdir, "data.corpus: 2 → 3 files")


def test_moved_files_with_the_same_content_resume(run, tmp_path):
  config, workdir = run
  moved = tmp_path / "elsewhere"
  shutil.copytree(os.path.dirname(config.data.corpus), moved)
  shutil.copy(config.data.tokenizer, tmp_path / "copy.model")
  config.data.corpus = str(moved / "*.txt")
  config.data.tokenizer = str(tmp_path / "copy.model")
  recipe_lib.check(config, workdir)


def test_the_workdirs_own_tokenizer_is_fingerprinted(run):
  config, workdir = run
  config.data.tokenizer = ""
  own = os.path.join(workdir, "spm", "spiece.model")
  os.makedirs(os.path.dirname(own))
  with open(own, "wb") as f:
    f.write(b"trained in the workdir")
  recipe_lib.record(config, workdir)
  recipe_lib.check(config, workdir)
  with open(own, "wb") as f:
    f.write(b"trained again, other")
  _refused(config, workdir, "data.tokenizer: content changed")
  os.remove(own)
  _refused(config, workdir, "data.tokenizer: no longer found")


def test_the_data_sections_files_are_the_recipes(run):
  """`data_files`, from the data section alone (what fine-tuning's data
  check reads), is the recipe's "files": configured files, and the
  workdir's own tokenizer where none is configured."""
  config, workdir = run
  files = recipe_lib.recipe(config, workdir)["files"]
  assert set(files) == {"data.corpus", "data.tokenizer"}
  assert recipe_lib.data_files(config.data, workdir) == files
  config.data.tokenizer = ""
  own = os.path.join(workdir, "spm", "spiece.model")
  os.makedirs(os.path.dirname(own))
  with open(own, "wb") as f:
    f.write(b"trained in the workdir")
  files = recipe_lib.recipe(config, workdir)["files"]
  assert set(files) == {"data.corpus", "data.tokenizer"}
  assert recipe_lib.data_files(config.data, workdir) == files


def test_a_prepared_mixture_is_recorded_and_checked(run, tmp_path):
  config, workdir = run
  data = tmp_path / "data"
  data.mkdir()
  mixture = [{"input": "books/*", "format": "sentences", "weight": 3.0,
              "read_documents": 10, "documents": 30, "instances": 50},
             {"input": "web/*", "format": "jsonl:text", "weight": 0.5,
              "read_documents": 10, "documents": 5, "instances": 9}]
  (data / "dataset.json").write_text(json.dumps({"mixture": mixture}),
                                     encoding="utf-8")
  config.data.data_dir = str(data)
  recipe_lib.record(config, workdir)
  with open(os.path.join(workdir, recipe_lib.RECIPE), encoding="utf-8") as f:
    assert json.load(f)["config"]["data.mixture"] == [
        {"input": "books/*", "format": "sentences", "weight": 3.0},
        {"input": "web/*", "format": "jsonl:text", "weight": 0.5}]
  recipe_lib.check(config, workdir)
  mixture[1]["weight"] = 1.0
  (data / "dataset.json").write_text(json.dumps({"mixture": mixture}),
                                     encoding="utf-8")
  _refused(config, workdir, "data.mixture: [{'format': 'sentences'",
           "'weight': 0.5}] → [", "'weight': 1.0}]",
           "data.data_dir: content changed")


def test_num_train_steps_may_grow_not_shrink(run):
  config, workdir = run
  assert config.num_train_steps == 10
  config.num_train_steps = 20
  recipe_lib.check(config, workdir)
  config.num_train_steps = 5
  _refused(config, workdir, "num_train_steps: 10 → 5 (it may grow")


def _leaves(config, prefix=""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def _other(value):
  """A different value of the same type."""
  if isinstance(value, bool):
    return not value
  if isinstance(value, (int, float)):
    return value + 1
  if isinstance(value, str):
    return value + "x"
  if isinstance(value, tuple):
    return value + (("extra", 1),)
  return "changed"


LEAVES = sorted(k for k, _ in _leaves(tiny_config())
                if k not in ("data.corpus", "data.tokenizer"))


@pytest.mark.parametrize("key", LEAVES)
def test_every_field_is_either_checked_or_listed_as_changeable(key,
                                                               tmp_path):
  """Changing any one field of a real config is refused exactly when it is
  not in MAY_CHANGE (num_train_steps: when it shrinks)."""
  workdir = str(tmp_path)
  config = tiny_config()
  recipe_lib.record(config, workdir)
  section, _, field = key.rpartition(".")
  target = config
  for part in filter(None, section.split(".")):
    target = target[part]
  with config.unlocked(), target.ignore_type():
    target[field] = _other(target[field])
  changeable = any(key == k or key.startswith(k + ".")
                   for k in recipe_lib.MAY_CHANGE)
  if changeable:
    recipe_lib.check(config, workdir)
  else:
    with pytest.raises(recipe_lib.RecipeError, match=f"  {key}: "):
      recipe_lib.check(config, workdir)


def test_a_real_rerun_with_another_architecture_changes_nothing(
    tiny_sop_dataset, fast_compile, tmp_path):
  """The journey: a tiny run trains and records its recipe; the same command
  with four layers instead of two (same shapes under share=all) is refused
  before anything in the workdir is written, config.json included."""
  del fast_compile
  tokenizer, data_dir = tiny_sop_dataset
  config = tiny_config()
  config.data.tokenizer, config.data.data_dir = tokenizer, data_dir
  config.num_train_steps = 2
  config.eval_batches = 0
  config.fast_compile = True
  workdir = str(tmp_path / "w")
  pretrain.run(config, workdir)
  assert os.path.isfile(os.path.join(workdir, recipe_lib.RECIPE))
  before = snapshot(workdir)
  config.model.num_hidden_layers = 4
  with pytest.raises(recipe_lib.RecipeError,
                     match="model.num_hidden_layers: 2 → 4"):
    pretrain.run(config, workdir)
  assert snapshot(workdir) == before


def test_a_field_the_code_added_later_does_not_refuse_old_runs(run):
  """A recipe recorded before a config field existed resumes: only fields
  both sides have are compared."""
  import json  # pylint: disable=g-import-not-at-top
  config, workdir = run
  path = os.path.join(workdir, recipe_lib.RECIPE)
  with open(path, encoding="utf-8") as f:
    old = json.load(f)
  del old["config"]["masking.random_token_prob"]
  with open(path, "w", encoding="utf-8") as f:
    json.dump(old, f)
  recipe_lib.check(config, workdir)
