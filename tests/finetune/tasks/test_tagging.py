"""Token classification: conlleval's entity scores on hand-computed cases,
CoNLL-2003 files and TFDS conll2003 (mock data) into features."""

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from albert_jax.finetune.tasks.tagging import conlleval
from albert_jax.finetune import tabular
from albert_jax.finetune.tasks.tagging import ner

SEQ = 16


def test_conlleval_by_hand():
  # One right PER chunk; LOC guessed as ORG.
  gold_a, guess_a = ["B-PER", "I-PER", "O", "B-LOC"], [
      "B-PER", "I-PER", "O", "B-ORG"]
  got = conlleval.evaluate([gold_a], [guess_a])
  assert got == {
      "precision": 0.5, "recall": 0.5, "f1": 0.5, "accuracy": 0.75,
      "precision_LOC": 0.0, "recall_LOC": 0.0, "f1_LOC": 0.0,
      "precision_ORG": 0.0, "recall_ORG": 0.0, "f1_ORG": 0.0,
      "precision_PER": 1.0, "recall_PER": 1.0, "f1_PER": 1.0}
  # IOB1: B- after I- of the same type starts a second chunk, so the gold
  # has two chunks where the guess has one spanning both: nothing right.
  gold_b, guess_b = ["I-PER", "I-PER", "B-PER", "O"], [
      "I-PER", "I-PER", "I-PER", "O"]
  assert conlleval.chunks(gold_b) == [("PER", 0, 2), ("PER", 2, 3)]
  assert conlleval.chunks(guess_b) == [("PER", 0, 3)]
  got = conlleval.evaluate([gold_b], [guess_b])
  assert (got["precision"], got["recall"], got["f1"]) == (0.0, 0.0, 0.0)
  # Together: 1 right of 3 guessed and 4 gold chunks.
  got = conlleval.evaluate([gold_a, gold_b], [guess_a, guess_b])
  assert got["precision"] == pytest.approx(1 / 3, abs=1e-15)
  assert got["recall"] == 0.25
  assert got["f1"] == pytest.approx(2 / 7, abs=1e-15)
  assert got["accuracy"] == 0.75
  # A type change inside I- tags ends one chunk and starts another.
  assert conlleval.chunks(["B-PER", "I-LOC", "I-LOC", "O", "I-PER"]) == [
      ("PER", 0, 1), ("LOC", 1, 3), ("PER", 4, 5)]
  # Sentences never share a chunk: B-LOC | I-LOC is two, both right.
  got = conlleval.evaluate([["B-LOC"], ["I-LOC"]], [["B-LOC"], ["I-LOC"]])
  assert (got["precision"], got["recall"], got["f1"]) == (1.0, 1.0, 1.0)
  with pytest.raises(ValueError, match=r"^Sentence 0: 2 gold tags but 1 "
                     "guessed ones\\.$"):
    conlleval.evaluate([["O", "O"]], [["O"]])


def test_conll_files_and_first_subword_labels(tmp_path, tiny_tokenizer):
  tok = tiny_tokenizer
  train = tmp_path / "train.txt"
  train.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\n"
                   "rejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n"
                   "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n")
  task = ner.make_task("ner/files", ml_collections.ConfigDict(dict(
      train_file=str(train), eval_file=str(train))))
  assert task.labels == ("O", "B-MISC", "B-ORG", "B-PER", "I-PER")
  assert task.describe() == {"task_type": "token_classification",
                             "labels": list(task.labels)}
  split = task.load("eval", tok, SEQ)
  words = split.examples.words
  assert words == [["EU", "rejects", "German"], ["Peter", "Blackburn"]]
  ids = split.features["input_ids"][1]
  labels = split.features["labels"][1]
  pieces = [tok.encode(w) for w in words[1]]
  want_ids = [tok.cls_id] + pieces[0] + pieces[1] + [tok.sep_id]
  assert ids[:len(want_ids)].tolist() == want_ids
  want_labels = [-1] * SEQ
  want_labels[1], want_labels[1 + len(pieces[0])] = 3, 4
  assert labels.tolist() == want_labels
  assert split.features["attention_mask"][1].sum() == len(want_ids)
  # Gold tags on gold positions score perfectly.
  tags = np.where(split.features["labels"] >= 0, split.features["labels"], 0)
  assert task.evaluate({"tags": tags}, split) == {
      "precision": 1.0, "recall": 1.0, "f1": 1.0, "accuracy": 1.0}
  bad = tmp_path / "bad.txt"
  bad.write_text("EU B-ORG\nrejects\n")
  with pytest.raises(tabular.FileFormatError, match=(
      r"^data.train_file .*bad.txt, line 2: 'rejects' has no tag")):
    ner.make_task("ner/files", {"train_file": str(bad),
                                    "eval_file": str(train)})


@pytest.mark.parametrize("tags, fix", [
    (("PER", "O"), "'PER' as 'B-PER' on an entity's first word and 'I-PER' "
     "on the words after it"),
    (("B_LOC", "O"), "'B_LOC' as 'B-LOC'"),
    (("S-PER", "O"), "'S-PER' as 'B-PER'"),
])
def test_tags_other_than_iob_are_refused_with_the_renaming(tmp_path, tags,
                                                           fix):
  train = tmp_path / "train.txt"
  train.write_text(f"Peter {tags[0]}\nsings {tags[1]}\n")
  with pytest.raises(tabular.FileFormatError) as e:
    ner.make_task("ner/files", {"train_file": str(train),
                                    "eval_file": str(train)})
  assert str(e.value) == (
      f"data.train_file {train} has tags [{tags[0]!r}] that are not IOB "
      "tags ('O', 'B-TYPE', 'I-TYPE' or 'E-TYPE'); entity F1 and the "
      "predicted entities read only those, so these would be trained and "
      f"never count. Rename them, e.g. write {fix}.")
  good = tmp_path / "good.txt"
  good.write_text("Peter B-PER\nsings O\n")
  with pytest.raises(tabular.FileFormatError, match=r"^data.labels has tags "
                     r"\['PER'\] that are not IOB tags"):
    ner.make_task("ner/files", {"train_file": str(good),
                                    "eval_file": str(good),
                                    "labels": ["O", "B-PER", "PER"]})


def test_conll_files_in_other_encodings_are_refused(tmp_path):
  """CoNLL files are read by the labelled-file reader: a UTF-8 byte-order
  mark is dropped; Latin-1 is refused with the line, byte and fix."""
  good = tmp_path / "good.txt"
  good.write_bytes("\ufeffZoë B-PER\nrejects O\n".encode("utf-8"))
  assert ner.read_conll(str(good)) == ([["Zoë", "rejects"]],
                                           [["B-PER", "O"]])
  bad = tmp_path / "latin1.txt"
  bad.write_bytes("EU B-ORG\nZoë B-PER\n".encode("latin-1"))
  with pytest.raises(tabular.FileFormatError) as e:
    ner.read_conll(str(bad))
  assert str(e.value) == (
      f"{bad}, line 2, byte 3 (offset 11): bytes b'\\xeb' are not UTF-8; "
      "the file looks like Latin-1 or Windows-1252 text. Re-save it as "
      "UTF-8, e.g. iconv -f latin1 -t utf-8 latin1.txt > latin1.utf8.txt")


def test_tfds_conll2003_mock_data(tiny_tokenizer):
  task = ner.make_task("ner/conll2003", {"tfds_download": False})
  with tfds.testing.mock_data(num_examples=3):
    split = task.load("validation", tiny_tokenizer, SEQ)
  assert task.labels == ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC",
                         "I-LOC", "B-MISC", "I-MISC")
  assert split.num_rows == 3 and split.features["labels"].shape == (3, SEQ)
  first = split.examples.first
  labels = split.features["labels"]
  np.testing.assert_array_equal(labels >= 0, first >= 0)
  for r in range(3):
    for pos in np.flatnonzero(first[r] >= 0):
      assert task.labels[labels[r, pos]] == split.examples.tags[r][
          first[r, pos]]
  assert task.head(None).num_labels == 9


def test_entities_have_character_offsets():
  text = "  Peter  Blackburn visits Paris."
  words, spans = ner.split_words(text)
  assert words == ["Peter", "Blackburn", "visits", "Paris."]
  got = ner.entities(text, spans, ["B-PER", "I-PER", "O", "B-LOC"])
  assert got == [
      {"text": "Peter  Blackburn", "label": "PER", "start": 2, "end": 18},
      {"text": "Paris.", "label": "LOC", "start": 26, "end": 32}]
