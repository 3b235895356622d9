"""Tests for albert_jax.finetune.tasks.classification.files: the user's TSV/CSV/JSONL tasks,
their errors, metrics, prediction files, and splitting the bundled spam
corpus."""

import gzip
import itertools
import json
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
from locations import REPO
import ml_collections
import numpy as np
import pytest

from albert_jax.finetune import data_files
from albert_jax.finetune.tasks.classification import files
from albert_jax.finetune import run as ft
from albert_jax.finetune import tabular
from albert_jax.finetune import task as task_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import metrics

SPAM = str(REPO / "albert_jax" / "data" / "bundled" / "labeled"
           / "spam_assassin.tsv.gz")
VOCAB, SEQ = 300, 24

ROWS = [  # (text, other text, label, score)
    ("the war is over", "peace at last", "pos", 4.5),
    ("taxes rose again", "a bad year", "neg", 1.0),
    ("congress met today", "nothing new", "neutral", 2.5),
    ("the union is strong", "we are proud", "pos", 4.0),
]


@pytest.fixture(name="tok", scope="module")
def fixture_tok(tiny_tokenizer):
  """conftest's 300-piece SentencePiece model."""
  assert tiny_tokenizer.vocab_size == VOCAB
  return tiny_tokenizer


def _write(path, text, compress=None):
  data = text.encode("utf-8") if isinstance(text, str) else text
  if compress or str(path).endswith(".gz"):
    data = gzip.compress(data, mtime=0)
  path.write_bytes(data)
  return str(path)


def _in_format(path, rows, header=True):
  """ROWS as TSV, CSV or JSONL at `path` (by its extension)."""
  ext = tabular.file_format(str(path))
  names = ["text", "other", "label", "score"]
  if ext == ".jsonl":
    lines = [json.dumps(dict(zip(names, r))) for r in rows]
  elif ext == ".tsv":
    lines = (["\t".join(names)] if header else []) + [
        "\t".join(map(str, r)) for r in rows]
  else:
    lines = (["text,other,label,score"] if header else []) + [
        ",".join(f'"{v}"' if isinstance(v, str) else str(v) for v in r)
        for r in rows]
  return _write(path, "\n".join(lines) + "\n")


def _data(**kw):
  values = {"text_column": "text", "label_column": "label"}
  values.update(kw)
  return ml_collections.ConfigDict(values)


def _task(tmp_path, ext=".tsv", train=ROWS, eval_rows=ROWS[:3], **kw):
  d = _data(train_file=_in_format(tmp_path / f"train{ext}", train),
            eval_file=_in_format(tmp_path / f"eval{ext}", eval_rows), **kw)
  return files.make_task("files", d)


################################################################################
# Reading and features.
################################################################################


@pytest.mark.parametrize("ext", [".tsv", ".csv", ".jsonl", ".tsv.gz",
                                 ".csv.gz", ".jsonl.gz"])
def test_formats_give_the_same_features(tmp_path, tok, ext):
  task = _task(tmp_path, ext, text_columns=["text", "other"],
               text_column=None)
  assert task.labels == ("neg", "neutral", "pos")
  assert (task.num_labels, task.metric) == (3, "accuracy")
  assert task.eval_splits == ("eval",) and task.predict_splits == ("eval",)
  split = task.load("eval", tok, SEQ)
  assert split.has_labels and split.num_rows == 3
  np.testing.assert_array_equal(split.features["labels"], [2, 0, 1])
  assert split.features["labels"].dtype == np.int32
  for key in task_lib.INPUT_KEYS:
    assert split.features[key].dtype == np.int32
    assert split.features[key].shape == (3, SEQ)
  a, b = tok.encode("taxes rose again"), tok.encode("a bad year")
  ids = [tok.cls_id] + a + [tok.sep_id] + b + [tok.sep_id]
  pad = SEQ - len(ids)
  assert split.features["input_ids"][1].tolist() == ids + [tok.pad_id] * pad
  assert split.features["token_type_ids"][1].tolist() == (
      [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * pad)
  assert split.features["attention_mask"][1].tolist() == (
      [1] * len(ids) + [0] * pad)
  np.testing.assert_array_equal(split.examples.index, [0, 1, 2])
  assert split.examples.gold == ["pos", "neg", "neutral"]


def test_label_order_header_and_regression(tmp_path, tok):
  task = _task(tmp_path, labels=["pos", "neg", "neutral"])
  assert task.labels == ("pos", "neg", "neutral")
  np.testing.assert_array_equal(task.load("train", tok, SEQ).features[
      "labels"], [0, 1, 2, 0])
  # Integer labels sort numerically; JSON 10 and TSV "10" are one label.
  numeric = [(t, o, n, s) for (t, o, _, s), n in zip(ROWS, [10, 2, 9, 2])]
  task = _task(tmp_path, ".jsonl", train=numeric, eval_rows=numeric)
  assert task.labels == ("2", "9", "10")
  # No header row: columns named by data.header.
  d = _data(train_file=_in_format(tmp_path / "h.tsv", ROWS, header=False),
            eval_file=_in_format(tmp_path / "h.csv", ROWS, header=False),
            header=["text", "other", "label", "score"],
            label_column="score", task_type="regression")
  task = files.make_task("files", d)
  assert task.regression and task.metric == "pearson"
  split = task.load("eval", tok, SEQ)
  assert split.features["labels"].dtype == np.float32
  np.testing.assert_array_equal(split.features["labels"], [4.5, 1, 2.5, 4])


def test_test_file_without_labels(tmp_path, tok):
  test = _write(tmp_path / "test.jsonl", '{"text": "a"}\n\n{"text": "b"}\n')
  task = _task(tmp_path, test_file=test)
  assert task.predict_splits == ("eval", "test")
  split = task.load("test", tok, SEQ)
  assert not split.has_labels and split.examples.gold is None
  np.testing.assert_array_equal(split.features["labels"], [-1, -1])
  with pytest.raises(ValueError, match="no split 'validation'"):
    task.load("validation", tok, SEQ)


def test_bundled_spam_first_rows(tmp_path, tok):
  with gzip.open(SPAM, "rt", encoding="utf-8") as f:
    head = list(itertools.islice(f, 21))
  assert head[0] == "label\ttext\tsplit\n"
  rows = _write(tmp_path / "spam.tsv", "".join(head))
  # The file starts with its ham rows: training needs a spam row too.
  train = _write(tmp_path / "train.tsv",
                 "".join(head) + "spam\tcheap pills, click now\ttrain\n")
  task = files.make_task("files", _data(train_file=train, eval_file=rows,
                                            labels=["ham", "spam"]))
  assert task.labels == ("ham", "spam") and task.metric == "accuracy"
  split = task.load("eval", tok, SEQ)
  assert split.num_rows == 20
  assert split.examples.gold == ["ham"] * 20
  np.testing.assert_array_equal(split.features["labels"], [0] * 20)
  first = tok.encode(head[1].split("\t")[1])[:SEQ - 2]
  assert split.features["input_ids"][0].tolist() == (
      [tok.cls_id] + first + [tok.sep_id])
  # E-mails are long: every row is cut to SEQ.
  assert (split.features["attention_mask"].sum(1) == SEQ).all()


################################################################################
# Errors.
################################################################################


def _error(tmp_path, match, **kw):
  with pytest.raises(ValueError, match=match):
    _task(tmp_path, **kw)


def test_errors_name_file_line_and_fix(tmp_path):
  tsv = tmp_path / "bad.tsv"
  d = dict(train_file=_in_format(tmp_path / "ok.tsv", ROWS))
  d["eval_file"] = str(tmp_path / "missing.tsv")
  with pytest.raises(ValueError, match=r"data.eval_file .*missing.tsv' does "
                     "not exist"):
    files.make_task("files", _data(**d))
  d["eval_file"] = _write(tsv, b"text\tlabel\nfine\tpos\ncaf\xe9\tpos\n")
  with pytest.raises(ValueError) as e:
    files.make_task("files", _data(**d))
  assert str(e.value) == (
      f"{tsv}, line 3, byte 4 (offset 23): bytes b'\\xe9' are not UTF-8; "
      "the file looks like Latin-1 or Windows-1252 text. Re-save it as "
      "UTF-8, e.g. iconv -f latin1 -t utf-8 bad.tsv > bad.utf8.tsv")
  d["eval_file"] = _write(tsv, "text\tlabel\na\tpos\nb\tneg\textra\n")
  with pytest.raises(ValueError, match=r"bad.tsv, line 3: 3 fields, but "
                     r"there are 2 columns \(text, label\)"):
    files.make_task("files", _data(**d))
  d["eval_file"] = _write(tsv, "text\tlabel\n\na\tpos\nb\tmaybe\n")
  with pytest.raises(ValueError, match=r"bad.tsv, line 4 \(row 1\): label "
                     r"'maybe' does not occur in data.train_file"):
    files.make_task("files", _data(**d))
  d["eval_file"] = _write(tsv, "sentence\tlabel\na\tpos\n")
  with pytest.raises(ValueError, match=r"no column 'text'; its columns are "
                     r"\['sentence', 'label'\]"):
    files.make_task("files", _data(**d))
  d["eval_file"] = _write(tsv, "")
  with pytest.raises(ValueError, match="bad.tsv is empty"):
    files.make_task("files", _data(**d))
  d["eval_file"] = _write(tsv, "text\tlabel\n")
  with pytest.raises(ValueError, match="has no data rows below its header"):
    files.make_task("files", _data(**d))
  d["eval_file"] = _write(tmp_path / "bad.jsonl", '{"text": "a", "label": '
                          '"pos"}\n{"text": "b" "label": 1}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl, line 2: invalid JSON"):
    files.make_task("files", _data(**d))
  d["eval_file"] = _write(tmp_path / "bad.jsonl",
                          '{"text": "a", "label": "pos"}\n{"label": "pos"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl, line 2: no field 'text'"):
    files.make_task("files", _data(**d))
  # A quoted CSV field spanning lines: the next row's line is still right.
  d["eval_file"] = _write(tmp_path / "bad.csv",
                          'text,label\n"two\nlines",pos\nb,pos,x\n')
  with pytest.raises(ValueError, match=r"bad.csv, line 4: 3 fields"):
    files.make_task("files", _data(**d))
  d["eval_file"] = _write(tmp_path / "bad.txt", "x")
  with pytest.raises(ValueError, match=r"unknown format '.txt'"):
    files.make_task("files", _data(**d))


def test_a_lone_surrogate_is_refused_by_file_and_line(tmp_path):
  evalf = _write(tmp_path / "e.jsonl", '{"text": "fine", "label": "pos"}\n'
                 '{"text": "half \\udc00", "label": "neg"}\n')
  with pytest.raises(ValueError) as e:
    files.make_task("files", _data(
        train_file=_in_format(tmp_path / "t.tsv", ROWS), eval_file=evalf))
  assert str(e.value) == (
      f"{evalf}, line 2: 'half \\udc00' holds a lone UTF-16 surrogate "
      "(\\udc00), half of an escaped pair, which is not text. Fix the "
      "escape (a pair: \\ud83d\\ude00) or drop the line.")


def test_the_run_summary_names_the_data_file(tmp_path):
  """Not the task's registry name ("files"): the file it was cut from, or
  else the training file."""
  task = _task(tmp_path)
  config = ml_collections.ConfigDict({"data": _data(
      train_file=str(tmp_path / "train.tsv"), split_from="")})
  assert ft.data_name(config, task) == "train.tsv"
  config.data.split_from = "bundled/labeled/spam_assassin.tsv.gz"
  assert ft.data_name(config, task) == "spam_assassin.tsv.gz"
  result = {"task": "files", "data": "spam_assassin.tsv.gz", "step": 150,
            "best_step": 120, "eval_accuracy": 0.9273,
            "eval_majority_baseline_accuracy": 0.686}
  assert metrics.final_summary(result).splitlines() == [
      "Fine-tuned on spam_assassin.tsv.gz to step 150; best checkpoint: "
      "step 120.", "accuracy 0.9273 (majority-class baseline 0.6860)"]


def test_config_errors(tmp_path):
  _error(tmp_path, "exactly one of data.text_column",
         text_columns=["text", "other"])
  _error(tmp_path, "one or two column names", text_column=None,
         text_columns=["text", "other", "label"])
  _error(tmp_path, "task_type='ranking'; choose one of", task_type="ranking")
  _error(tmp_path, r"data.metric='f1'; this task reports \('accuracy', "
         r"'macro_f1'\)", metric="f1")
  _error(tmp_path, "at least two distinct labels", labels=["pos"])
  _error(tmp_path, r"train.tsv, line 2: label 'pos' is not a finite number",
         task_type="regression")
  _error(tmp_path, r"train.tsv, line 3: label 'inf' is not a finite number",
         text_column="other", label_column="text", task_type="regression",
         train=[("1.5", "x", "pos", 1.0), ("inf", "y", "neg", 2.0)])
  with pytest.raises(ValueError, match="needs data.train_file"):
    files.make_task("files", _data(eval_file="x.tsv"))
  with pytest.raises(ValueError, match=r"Unknown task 'glue/cola'"):
    files.make_task("glue/cola", _data())


def _message(tmp_path, ext=".tsv", **kw) -> str:
  with pytest.raises(ValueError) as e:
    _task(tmp_path, ext, **kw)
  return str(e.value)


def _relabel(rows, *labels):
  return [(t, o, label, s) for (t, o, _, s), label in zip(rows, labels)]


def test_label_whitespace_is_stripped_and_the_label_set_logged(tmp_path,
                                                                caplog):
  train = _relabel(ROWS, " pos", "neg ", "neutral", "pos")
  with caplog.at_level(logging.INFO, logger="albert_jax.finetune"):
    task = _task(tmp_path, ".jsonl", train=train,
                 eval_rows=_relabel(ROWS[:2], "pos\t", "neg"))
  assert task.labels == ("neg", "neutral", "pos")
  train_path, eval_path = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
  assert [r.getMessage() for r in caplog.records] == [
      f"data.train_file {train_path}: stripped the surrounding whitespace "
      "of 2 label(s), e.g. ' pos' → 'pos'.",
      f"data.eval_file {eval_path}: stripped the surrounding whitespace of "
      "1 label(s), e.g. 'pos\\t' → 'pos'.",
      f"data.train_file {train_path}: 3 labels, neg (1 rows), neutral (1 "
      "rows), pos (2 rows)."]
  assert [r.levelname for r in caplog.records] == [
      "WARNING", "WARNING", "INFO"]
  assert task._targets["eval"][1] == ["pos", "neg"]  # the gold as stripped
  np.testing.assert_array_equal(task._targets["eval"][0], [2, 0])


def test_labels_that_differ_only_in_case_are_refused(tmp_path):
  train = _relabel(ROWS, "spam", "ham", "Spam", "spam")
  assert _message(tmp_path, train=train) == (
      f"data.train_file {tmp_path / 'train.tsv'} has labels that differ "
      "only in case: 'spam' (2 rows), 'Spam' (1 rows). Write each label one "
      "way (e.g. every 'Spam' as 'spam'), or name the classes distinctly if "
      "they are meant to differ.")
  assert _message(tmp_path, labels=["pos", "Pos", "neg"]) == (
      "data.labels lists ['pos', 'Pos'], which differ only in case; list "
      "each label once, as the data writes it.")
  # split_file refuses them too, naming its input.
  src = _in_format(tmp_path / "all.tsv", train)
  with pytest.raises(ValueError) as e:
    data_files.split_file(src, str(tmp_path / "out"))
  assert str(e.value) == (
      f"split_file input {src} has labels that differ only in case: 'spam' "
      "(2 rows), 'Spam' (1 rows). Write each label one way (e.g. every "
      "'Spam' as 'spam'), or name the classes distinctly if they are meant "
      "to differ.")


def test_one_numbers_spellings_are_one_class_with_a_note(tmp_path, caplog):
  """JSON 1 and 1.0, TSV "1" and "1.0": one class each number, not two."""
  train = _relabel(ROWS, 1, 1.0, 0, 2.5)
  with caplog.at_level(logging.WARNING, logger="albert_jax.finetune"):
    task = _task(tmp_path, ".jsonl", train=train,
                 eval_rows=_relabel(ROWS[:3], "1.0", 0.0, 2.50))
  assert task.labels == ("0", "1", "2.5")
  np.testing.assert_array_equal(task._targets["train"][0], [1, 1, 0, 2])
  np.testing.assert_array_equal(task._targets["eval"][0], [1, 0, 2])
  train_path, eval_path = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
  assert [r.getMessage() for r in caplog.records] == [
      "Labels '1', '1.0' are one number; they are read as one class '1' (in "
      f"data.train_file {train_path}; data.eval_file {eval_path}).",
      "Labels '0', '0.0' are one number; they are read as one class '0' (in "
      f"data.train_file {train_path}; data.eval_file {eval_path})."]
  # data.labels spelt another way names the same classes.
  assert _task(tmp_path, ".jsonl", train=train, eval_rows=train,
               labels=["0.0", "1", "2.5"]).labels == ("0", "1", "2.5")


@pytest.mark.parametrize("ext", [".jsonl", ".tsv"])
def test_empty_and_null_labels_are_refused_by_file_and_line(tmp_path, ext):
  for label, word in ((None, "null"), ("", "empty"), ("  ", "empty")):
    if ext == ".tsv" and label is None:
      continue
    train = _relabel(ROWS, "pos", "neg", label, "pos")
    assert _message(tmp_path, ext, train=train) == (
        f"data.train_file {tmp_path / ('train' + ext)}, line "
        f"{4 if ext == '.tsv' else 3}: {word} label; fill it in or drop the "
        "row.")
    assert _message(tmp_path, ext, eval_rows=train[1:]) == (
        f"data.eval_file {tmp_path / ('eval' + ext)}, line "
        f"{3 if ext == '.tsv' else 2}: {word} label; fill it in or drop the "
        "row.")


def test_a_label_column_that_is_a_text_column_is_refused(tmp_path):
  assert _message(tmp_path, text_column="label") == (
      "data.label_column='label' is also a text column (data.text_column); "
      "the model would read the answer in its input. Name the text's own "
      "column(s) there.")
  assert _message(tmp_path, text_column=None,
                  text_columns=["text", "label"]).startswith(
                      "data.label_column='label' is also a text column "
                      "(data.text_columns)")


def test_an_eval_file_of_the_train_rows_is_warned_of_once(tmp_path, caplog):
  train_path = tmp_path / "train.tsv"
  with caplog.at_level(logging.WARNING, logger="albert_jax.finetune"):
    _task(tmp_path, eval_rows=ROWS)  # a copy of the train file
    _task(tmp_path)  # other rows: no warning
  eval_path = tmp_path / "eval.tsv"
  assert [r.getMessage() for r in caplog.records] == [
      f"data.eval_file {eval_path} holds the same rows as data.train_file "
      f"{train_path}: the best checkpoint is picked, and eval metrics are "
      "measured, on training rows, which says nothing of unseen text. Hold "
      "rows out for evaluation: python -m albert_jax.finetune.data_files "
      f"split {train_path} OUT_DIR cuts one file into train, eval and test "
      "files."]
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="albert_jax.finetune"):
    files.make_task("files", _data(train_file=str(train_path),
                                       eval_file=str(train_path)))
  assert len(caplog.records) == 1
  assert "holds the same rows as" in caplog.records[0].getMessage()


def test_a_train_file_of_one_label_is_refused(tmp_path):
  one = _relabel(ROWS, "pos", "pos", "pos", "pos")
  expected = (
      f"data.train_file {tmp_path / 'train.tsv'} holds only the label 'pos' "
      "(4 rows); a classifier learns from rows of two labels or more. Add "
      "rows of the other labels (or, for a numeric target, set "
      "data.task_type='regression').")
  assert _message(tmp_path, train=one) == expected
  # Listing the other labels in data.labels does not make up for the rows.
  assert _message(tmp_path, train=one, labels=["neg", "pos"]) == expected


def test_an_eval_label_the_train_file_lacks_is_refused(tmp_path, caplog):
  train = _relabel(ROWS, "spam", "ham", "ham", "spam")
  assert _message(
      tmp_path, train=train,
      eval_rows=_relabel(ROWS[:3], "ham", "Spam", "spam")) == (
          f"data.eval_file {tmp_path / 'eval.tsv'}, line 3 (row 1): label "
          f"'Spam' does not occur in data.train_file {tmp_path / 'train.tsv'}"
          " (did you mean 'spam'?); the model cannot learn a label it never "
          "sees. Correct the label, or add training rows with it.")
  # Listed in data.labels but never trained on: refused as well (and the
  # label without rows is warned of).
  with caplog.at_level(logging.WARNING, logger="albert_jax.finetune"):
    message = _message(tmp_path, train=train, labels=["ham", "spam", "eggs"],
                       eval_rows=_relabel(ROWS[:1], "eggs"))
  assert message.startswith(f"data.eval_file {tmp_path / 'eval.tsv'}, line "
                            "2 (row 0): label 'eggs' does not occur in ")
  assert caplog.records[-1].getMessage() == (
      f"data.labels ['eggs'] have no rows in data.train_file "
      f"{tmp_path / 'train.tsv'}; the model will never predict them.")


@pytest.mark.parametrize("data, expected", [
    (("text\tlabel\ncafé\tpos\n".encode("utf-16"), "e.tsv"),
     "{path} starts with the byte-order mark of UTF-16 (little-endian) "
     "text; albert_jax reads UTF-8. Re-save it as UTF-8, e.g. iconv -f "
     "utf-16 -t utf-8 e.tsv > e.utf8.tsv"),
    (("text\tlabel\ncafé\tpos\n".encode("utf-16-le"), "e.tsv.gz"),
     "{path}, line 1, byte 2 (offset 1 of the uncompressed text): NUL "
     "bytes beside the text, as UTF-16 without a byte-order mark writes it "
     "(or the file is not text); albert_jax reads UTF-8. Re-save it as "
     "UTF-8, e.g. zcat e.tsv.gz | iconv -f utf-16le -t utf-8 | gzip > "
     "e.utf8.tsv.gz"),
    (("text,label\n\"Zoë, 2\",pos\n".encode("cp1252"), "e.csv"),
     "{path}, line 2, byte 4 (offset 14): bytes b'\\xeb' are not UTF-8; "
     "the file looks like Latin-1 or Windows-1252 text. Re-save it as "
     "UTF-8, e.g. iconv -f latin1 -t utf-8 e.csv > e.utf8.csv"),
    (('{"text": "ok é", "label": "pos"}\n{"text": "b\xe9", "label": '
      '"neg"}\n').encode("utf-8").replace(b"b\xc3\xa9", b"b\xe9"),
     "{path}, line 2, byte 12 (offset 45): bytes b'\\xe9' are not UTF-8; "
     "earlier lines are, so this line is damaged or the file mixes "
     "encodings: re-save that line as UTF-8"),
], ids=["utf16-bom", "utf16le-gz", "cp1252", "damaged-utf8"])
def test_other_encodings_are_refused_with_the_place_and_the_fix(
    tmp_path, data, expected):
  raw, name = data if isinstance(data, tuple) else (data, "e.jsonl")
  path = _write(tmp_path / name, raw)
  d = _data(train_file=_in_format(tmp_path / "train.tsv", ROWS),
            eval_file=path)
  with pytest.raises(tabular.FileFormatError) as e:
    files.make_task("files", d)
  assert str(e.value) == expected.format(path=path)


def test_a_utf8_byte_order_mark_is_dropped(tmp_path, tok):
  path = _write(tmp_path / "eval.csv", "\ufefftext,label\ncafé,pos\n")
  d = _data(train_file=_in_format(tmp_path / "train.tsv", ROWS),
            eval_file=path)
  split = files.make_task("files", d).load("eval", tok, SEQ)
  assert split.examples.gold == ["pos"]
  ids = [tok.cls_id] + tok.encode("café") + [tok.sep_id]
  assert split.features["input_ids"][0, :len(ids)].tolist() == ids


def test_misspelt_names_are_refused_with_the_closest(tmp_path):
  assert _message(tmp_path, label_column="lable") == (
      f"data.train_file {tmp_path / 'train.tsv'} has no column 'lable' (did "
      "you mean 'label'?); its columns are ['text', 'other', 'label', "
      "'score']. Fix data.label_column in the config.")
  assert _message(tmp_path, text_column="Text") == (
      f"data.train_file {tmp_path / 'train.tsv'} has no column 'Text' (did "
      "you mean 'text'?); its columns are ['text', 'other', 'label', "
      "'score']. Fix the column name in the config.")
  assert _message(tmp_path, task_type="regresion") == (
      "data.task_type='regresion' (did you mean 'regression'?); choose one "
      "of ('classification', 'regression').")
  assert _message(tmp_path, metric="acuracy") == (
      "data.metric='acuracy' (did you mean 'accuracy'?); this task reports "
      "('accuracy', 'macro_f1') (higher is better).")


################################################################################
# Model, metrics and prediction files.
################################################################################


def test_regression_task_on_the_model(tmp_path, tok, fast_compile):
  task = _task(tmp_path, label_column="score", task_type="regression")
  split = task.load("train", tok, SEQ)
  cfg = ModelConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32,
                    num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=SEQ,
                    classifier_dropout_prob=0.1)
  model = task_lib.FineTuneModel(cfg, task.head(cfg))
  weights = np.array([1, 1, 1, 0], np.float32)
  batch = dict(split.features, weights=weights)

  def forward(key):
    params = nn.unbox(model.init(key, batch, deterministic=True))
    out = model.apply(params, batch, deterministic=False,
                      rngs={"dropout": jax.random.key(1)})
    # The padding row's label must not matter.
    other = dict(batch, labels=jnp.asarray(batch["labels"]).at[3].set(1e6))
    return (out, task.loss_sums(out, batch), task.loss_sums(out, other),
            task.predict(out, batch))

  out, sums, other, pred = jax.jit(forward, compiler_options=fast_compile)(
      jax.random.key(0))
  values = np.asarray(out["logits"])[:, 0]
  np.testing.assert_array_equal(pred["prediction"], values)
  expected = np.sum(weights * (values - split.features["labels"]) ** 2)
  np.testing.assert_allclose(sums["loss_sum"], expected, rtol=1e-5)
  assert other["loss_sum"] == sums["loss_sum"]


def test_evaluate_and_prediction_files(tmp_path, tok):
  three = _task(tmp_path)
  split = three.load("eval", tok, SEQ)  # gold: pos, neg, neutral
  assert three.evaluate({"prediction": np.array([2, 0, 0])}, split) == (
      pytest.approx({"accuracy": 2 / 3, "macro_f1": (1 + 2 / 3 + 0) / 3}))
  paths = three.write_predictions({"prediction": np.array([2, 0, 0])}, split,
                                  str(tmp_path / "out"))
  assert paths == [str(tmp_path / "out" / "eval_predictions.tsv")]
  with open(paths[0], encoding="utf-8") as f:
    assert f.read() == ("row\tprediction\tlabel\n0\tpos\tpos\n1\tneg\tneg\n"
                        "2\tneg\tneutral\n")

  binary = [r for r in ROWS if r[2] != "neutral"]
  two = _task(tmp_path, train=binary, eval_rows=binary, metric="f1")
  assert two.metric == "f1" and two.labels == ("neg", "pos")
  split = two.load("eval", tok, SEQ)  # gold: pos, neg, pos
  assert two.evaluate({"prediction": np.array([1, 1, 0])}, split) == (
      pytest.approx({"accuracy": 1 / 3, "f1": 0.5}))

  reg = _task(tmp_path, ".jsonl", label_column="score",
              task_type="regression")
  split = reg.load("eval", tok, SEQ)  # gold: 4.5, 1.0, 2.5
  result = reg.evaluate({"prediction": np.array([3.0, 1.0, 2.0])}, split)
  # Centred: (1, −1, 0)·(11/6, −10/6, −1/6) = 7/2 over √2·√222/6.
  assert result["pearson"] == pytest.approx(21 / np.sqrt(444), abs=1e-15)
  assert result["spearman"] == pytest.approx(1.0)
  test = _write(tmp_path / "t.tsv", "text\tother\nx\ty\n")
  reg = _task(tmp_path, label_column="score", task_type="regression",
              test_file=test)
  split = reg.load("test", tok, SEQ)
  assert np.isnan(split.features["labels"]).all()
  path, = reg.write_predictions({"prediction": np.array([1.25])}, split,
                                str(tmp_path))
  with open(path, encoding="utf-8") as f:
    assert f.read() == "row\tprediction\n0\t1.250000\n"


################################################################################
# split_file.
################################################################################


def test_split_file_on_the_bundled_spam(tmp_path, tok):
  result = data_files.split_file(SPAM, str(tmp_path / "a"), seed=0)
  # 4150 ham and 1896 spam, dealt 80/10/10 per label.
  assert {k: (v["rows"], v["labels"]) for k, v in result.items()} == {
      "train": (4837, {"ham": 3320, "spam": 1517}),
      "eval": (605, {"ham": 415, "spam": 190}),
      "test": (604, {"ham": 415, "spam": 189})}
  again = data_files.split_file(SPAM, str(tmp_path / "b"), seed=0)
  other = data_files.split_file(SPAM, str(tmp_path / "c"), seed=1)
  original = tabular.read_table(SPAM)
  seen = []
  for name, info in result.items():
    assert info["path"] == str(tmp_path / "a" / f"{name}.tsv.gz")
    with open(info["path"], "rb") as f, open(again[name]["path"], "rb") as g:
      data = f.read()
      assert data == g.read()
    with open(other[name]["path"], "rb") as f:
      assert data != f.read()
    table = tabular.read_table(info["path"])
    assert table.columns == ("label", "text", "split")
    seen += [tuple(r.values()) for r in table.rows]
  # Every row lands in exactly one split.
  assert sorted(seen) == sorted(tuple(r.values()) for r in original.rows)
  task = files.make_task("files", _data(
      train_file=result["train"]["path"], eval_file=result["eval"]["path"],
      test_file=result["test"]["path"]))
  assert task.labels == ("ham", "spam")
  assert task.predict_splits == ("eval", "test")


def test_split_file_formats_and_cli(tmp_path, capsys):
  rows = [(f"text {i}", "o", "ab"[i % 2], i) for i in range(10)]
  src = _in_format(tmp_path / "all.jsonl", rows)
  result = data_files.split_file(src, str(tmp_path / "out"), (0.6, 0.2, 0.2),
                              seed=3)
  assert [v["labels"] for v in result.values()] == [
      {"a": 3, "b": 3}, {"a": 1, "b": 1}, {"a": 1, "b": 1}]
  table = tabular.read_table(result["eval"]["path"])
  assert all(r["text"].startswith("text ") for r in table.rows)
  src = _in_format(tmp_path / "all.csv", rows, header=False)
  result = data_files.split_file(src, str(tmp_path / "csv"), (0.6, 0.2, 0.2),
                              label_column="c", header=["t", "o", "c", "s"])
  table = tabular.read_table(result["train"]["path"], ["t", "o", "c", "s"])
  assert len(table.rows) == 6
  with pytest.raises(ValueError, match="three positive shares"):
    data_files.split_file(src, str(tmp_path), (0.5, 0.5))
  assert data_files.main(["split", SPAM, str(tmp_path / "cli")]) == 0
  assert "eval.tsv.gz: 605 rows (ham 415, spam 190)" in capsys.readouterr().out
