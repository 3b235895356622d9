"""Fine-tuning data and prediction files on gs:// (the Cloud Storage
emulator) behave exactly as local ones."""

import gzip
import json

import ml_collections
import numpy as np
import pytest

from albert_jax import storage
from albert_jax.finetune import data_files
from albert_jax.finetune.tasks.classification import files as file_task
from albert_jax.finetune.tasks.classification import glue
from albert_jax.finetune.tasks.multiple_choice import race
from albert_jax.finetune import run as ft
from albert_jax.finetune import tabular
from albert_jax.finetune import task as task_lib
from albert_jax.finetune.tasks.squad import evaluate as squad_eval

SEQ = 24
TRAIN_TSV = ("text\tother\tlabel\nthe war is over\tpeace at last\tpos\n"
             "taxes rose again\ta bad year\tneg\n"
             "congress met today\tnothing new\tneutral\n")
EVAL_JSONL = "".join(json.dumps(r) + "\n" for r in [
    {"text": "the union is strong", "other": "we are proud", "label": "pos"},
    {"text": "taxes rose", "other": "again", "label": "neg"}])
TEST_CSV = 'text,other\n"a, quoted text",more\nplain,"multi\nline"\n'


def _files(root) -> dict[str, str]:
  """Train, eval and test files (TSV, JSONL, gzipped CSV) under `root`,
  written through `albert_jax.storage`."""
  data = {"train.tsv": TRAIN_TSV.encode(), "eval.jsonl": EVAL_JSONL.encode(),
          "test.csv.gz": gzip.compress(TEST_CSV.encode(), mtime=0)}
  for name, blob in data.items():
    storage.path(f"{root}/{name}").parent.mkdir(parents=True, exist_ok=True)
    storage.path(f"{root}/{name}").write_bytes(blob)
  return {f"{split}_file": f"{root}/{name}"
          for split, name in zip(("train", "eval", "test"), data)}


def _task(root):
  return file_task.make_task("files", ml_collections.ConfigDict(dict(
      text_columns=["text", "other"], label_column="label", **_files(root))))


def test_files_task_reads_gcs_as_local(gcs_bucket, tmp_path, tiny_tokenizer):
  local, remote = _task(str(tmp_path)), _task(f"{gcs_bucket}/data")
  assert remote.labels == local.labels == ("neg", "neutral", "pos")
  for name in ("train", "eval", "test"):
    want = local.load(name, tiny_tokenizer, SEQ)
    got = remote.load(name, tiny_tokenizer, SEQ)
    assert (got.name, got.has_labels, got.num_rows) == (
        want.name, want.has_labels, want.num_rows)
    assert sorted(got.features) == sorted(want.features)
    for key, value in want.features.items():
      np.testing.assert_array_equal(got.features[key], value, err_msg=key)
    np.testing.assert_array_equal(got.examples.index, want.examples.index)
    assert got.examples.gold == want.examples.gold
  assert remote.load("test", tiny_tokenizer, SEQ).num_rows == 2
  config = ml_collections.ConfigDict({"data": {
      "train_file": f"{gcs_bucket}/data/train.tsv"}})
  assert ft.data_name(config, remote) == "train.tsv"


def test_missing_gcs_file_is_named_as_given(gcs_bucket):
  files = _files(f"{gcs_bucket}/data")
  files["eval_file"] = f"{gcs_bucket}/data/nope.tsv"
  with pytest.raises(tabular.FileFormatError) as error:
    file_task.make_task("files", ml_collections.ConfigDict(dict(
        text_column="text", label_column="label", **files)))
  assert str(error.value) == (
      f"data.eval_file '{gcs_bucket}/data/nope.tsv' does not exist; check "
      "the path.")


def test_split_file_from_and_into_gcs(gcs_bucket, tmp_path):
  rows = "".join(f"text {i}\t{'ab'[i % 2]}\n" for i in range(20))
  source = f"{gcs_bucket}/in/all.tsv.gz"
  storage.path(source).write_bytes(gzip.compress(
      f"text\tlabel\n{rows}".encode(), mtime=0))
  (tmp_path / "all.tsv.gz").write_bytes(storage.path(source).read_bytes())
  got = data_files.split_file(source, f"{gcs_bucket}/out", seed=3)
  want = data_files.split_file(str(tmp_path / "all.tsv.gz"),
                            str(tmp_path / "out"), seed=3)
  for name in ("train", "eval", "test"):
    assert got[name]["path"] == f"{gcs_bucket}/out/{name}.tsv.gz"
    assert {k: v for k, v in got[name].items() if k != "path"} == {
        k: v for k, v in want[name].items() if k != "path"}
    assert storage.path(got[name]["path"]).read_bytes() == (
        tmp_path / "out" / f"{name}.tsv.gz").read_bytes()
  assert [got[n]["rows"] for n in ("train", "eval", "test")] == [16, 2, 2]


def _split(name, examples, n, has_labels=True):
  features = {"input_ids": np.zeros((n, 2), np.int32),
              "labels": np.zeros(n, np.int32)}
  return task_lib.Split(name, features, examples, has_labels)


def test_prediction_files_written_into_gcs(gcs_bucket, tmp_path):
  """Every task's prediction files: the same bytes as a local directory."""
  files, rte = _task(str(tmp_path)), glue.make_task("glue/rte", {})
  dev = race.make_task("race/all", {})
  writes = [
      (files, {"prediction": np.array([2, 0])},
       _split("eval", file_task.Rows(np.arange(2), ["pos", "neg"]), 2)),
      (rte, {"prediction": np.array([1, 0])},
       _split("test", glue.Rows(np.array([0, 1]), "RTE.tsv"), 2, False)),
      (dev, {"prediction": np.array([3])},
       _split("dev", {"ids": ["m1.txt-0"], "levels": np.array(["middle"]),
                      "labels": np.array([1])}, 1))]
  remote = f"{gcs_bucket}/run/predictions"
  for task, preds, split in writes:
    got = task.write_predictions(preds, split, remote)
    want = task.write_predictions(preds, split, str(tmp_path / "out"))
    assert got == [p.replace(str(tmp_path / "out"), remote) for p in want]
    for g, w in zip(got, want):
      assert storage.path(g).read_bytes() == storage.path(w).read_bytes()
  assert storage.path(f"{remote}/RTE.tsv").read_text() == (
      "index\tprediction\n0\tnot_entailment\n1\tentailment\n")
  path = squad_eval.write_json(f"{remote}/predictions.json", {"q": "Paris"})
  assert path == f"{remote}/predictions.json"
  assert storage.path(path).read_text() == '{\n    "q": "Paris"\n}\n'
