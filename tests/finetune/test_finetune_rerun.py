"""A finished fine-tuning workdir refuses to rerun on other data
(finetune/data_files.py `check_data`): its checkpoints, predictions and
final_metrics.json stay those of the data it was trained on."""

import json
import os

import pytest

from albert_jax import config_lib
from albert_jax.finetune import after_pretraining as after
from albert_jax.finetune import data_files
from albert_jax.finetune import run as ft
from albert_jax.training import recipe
from test_bad_inputs import snapshot  # pylint: disable=g-bad-import-order


SEQ, VOCAB = 16, 50


def _tsv(path, rows):
  path.write_text("text\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows),
                  encoding="utf-8")
  return str(path)


def _config(tokenizer, **data):
  c = config_lib.classify_config(batch_size=4, num_train_steps=2,
                                 warmup_steps=1, max_seq_length=SEQ)
  for k, v in config_lib.tiny_model(vocab_size=VOCAB,
                                    max_position_embeddings=SEQ,
                                    num_hidden_layers=1).items():
    c.model[k] = v
  c.data.tokenizer = tokenizer
  c.data.text_column = "text"
  c.data.split_fractions = (0.6, 0.2, 0.2)
  c.data.update(data)
  c.log_every_steps = c.eval_every_steps = c.checkpoint_every_steps = 2
  c.async_checkpoints = False
  c.fast_compile = True
  return c


def test_a_finished_workdir_refuses_other_data(tmp_path, spm_of_size):
  tokenizer = spm_of_size(VOCAB)
  words = ["abc def", "gh ab", "cab bad", "fed hag", "bag deed"]
  first = _tsv(tmp_path / "first.tsv",
               [(w, "xy"[i % 2]) for i, w in enumerate(words * 4)])
  other = _tsv(tmp_path / "other.tsv",
               [(w, "xy"[i % 3 == 0]) for i, w in enumerate(words * 4)])
  # The demo's layout: data.split_from cut into WORKDIR/data, as
  # run_after_pretraining cuts it, then fine-tuned there.
  pretrain = tmp_path / "pretrain"
  workdir = str(pretrain / "finetune")
  parts = data_files.split_file(first, os.path.join(workdir, "data"),
                             (0.6, 0.2, 0.2), seed=0)
  trained = _config(tokenizer, split_from=first,
                    **{f"{k}_file": v["path"] for k, v in parts.items()})
  result = ft.run(trained, workdir)
  assert result["step"] == 2 and result["data"] == "first.tsv"
  before = snapshot(workdir)
  with open(os.path.join(workdir, "final_metrics.json"),
            encoding="utf-8") as f:
    assert json.load(f) == result

  # The same data passes: the same files, or the same source split again.
  data_files.check_data(trained.data, workdir, seed=trained.seed)
  resplit = _config(tokenizer, split_from=first)
  data_files.check_data(resplit.data, workdir, seed=resplit.seed)
  fix = ("; its checkpoints, predictions and final_metrics.json belong to "
         "the data it was trained on. Fine-tune on the new data in a new "
         "workdir (another --workdir), or rerun with the original files.")
  # Another source for the split: refused before the split rewrites
  # WORKDIR/data (or anything else is written).
  with pytest.raises(recipe.RecipeError) as e:
    after.run_after_pretraining(_config(tokenizer, split_from=other),
                             str(pretrain))
  assert str(e.value) == (
      f"{workdir} was fine-tuned on data.split_from={first}, and this run "
      f"gives other data (data.split_from={other})" + fix)
  # Other files named directly: refused by the run itself.
  again = _config(tokenizer, train_file=other,
                  eval_file=parts["eval"]["path"],
                  test_file=parts["test"]["path"])
  with pytest.raises(recipe.RecipeError) as e:
    ft.run(again, workdir)
  assert str(e.value) == (
      f"{workdir} was fine-tuned on data.split_from={first}, and this run "
      f"gives other data (data.train_file={other})" + fix)
  assert snapshot(workdir) == before  # final_metrics.json as it was


def test_a_changed_file_and_a_dropped_one_are_named(tmp_path):
  """The message names what changed; a workdir trained on named files names
  them (no fine-tune needed: the recipe and config.json are what count)."""
  train = _tsv(tmp_path / "train.tsv", [("a b", "x"), ("c d", "y")])
  test = _tsv(tmp_path / "test.tsv", [("e f", "x")])
  config = _config("", train_file=train, eval_file=train, test_file=test)
  workdir = tmp_path / "workdir"
  workdir.mkdir()
  recipe.record(config, str(workdir))
  (workdir / "config.json").write_text(config.to_json_best_effort(),
                                       encoding="utf-8")
  data_files.check_data(config.data, str(workdir), seed=config.seed)
  _tsv(tmp_path / "train.tsv", [("a b", "x"), ("c d", "x")])
  config.data.test_file = None
  with pytest.raises(recipe.RecipeError) as e:
    data_files.check_data(config.data, str(workdir), seed=config.seed)
  assert str(e.value).startswith(
      f"{workdir} was fine-tuned on data.train_file={train}, "
      f"data.eval_file={train}, data.test_file={test}, and this run gives "
      f"other data (data.train_file={train} (its content changed), "
      f"data.eval_file={train} (its content changed), data.test_file=none);")


def test_a_fine_tune_cuts_split_from_into_its_workdir(tmp_path, spm_of_size):
  """data.split_from on any fine-tune (configs/bundled.py, the downstream
  suite's bundled tasks), not only after pre-training: the file is cut into
  WORKDIR/data under the run's lease, the run trains on those files and
  records them, and the caller's config is left as given."""
  tokenizer = spm_of_size(VOCAB)
  words = ["abc def", "gh ab", "cab bad", "fed hag", "bag deed"]
  source = _tsv(tmp_path / "labelled.tsv",
                [(w, "xy"[i % 2]) for i, w in enumerate(words * 4)])
  workdir = tmp_path / "work"
  config = _config(tokenizer, split_from=source)
  result = ft.run(config, str(workdir))
  assert result["step"] == 2 and result["data"] == "labelled.tsv"
  assert config.data.train_file == ""  # the caller's config, untouched
  expected = data_files.split_file(source, str(tmp_path / "expected"),
                                   (0.6, 0.2, 0.2), seed=0)
  recorded = json.loads((workdir / "config.json").read_text())["data"]
  for name, part in expected.items():
    cut = workdir / "data" / f"{name}.tsv"
    assert cut.read_bytes() == open(part["path"], "rb").read()
    assert recorded[f"{name}_file"] == str(cut)
  # A rerun finds the same data and the run finished.
  assert ft.run(config, str(workdir))["step"] == 2
