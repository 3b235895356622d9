"""The bundled downstream task built from the corpus
(labeled/corpus_source.tsv.gz): it rebuilds byte for byte, and none of
its sentences is in a document the demo pre-trains on."""

import collections
import gzip
import importlib.util
import os

from albert_jax import data as data_lib
from albert_jax.data.shards import is_eval_document
from albert_jax.text import documents as documents_lib

BUNDLED = os.path.join(os.path.dirname(data_lib.__file__), "bundled")
TASK = os.path.join(BUNDLED, "labeled", "corpus_source.tsv.gz")


def builder():
  spec = importlib.util.spec_from_file_location(
      "build_corpus_source",
      os.path.join(BUNDLED, "scripts", "build_corpus_source.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def task_rows():
  with gzip.open(TASK, "rt", encoding="utf-8") as f:
    header, *lines = f.read().rstrip("\n").split("\n")
  assert header == "label\ttext"
  return [tuple(line.split("\t")) for line in lines]


def test_corpus_source_rebuilds_byte_for_byte():
  build = builder()
  with open(TASK, "rb") as f:
    assert build.tsv_bytes(build.rows(BUNDLED)) == f.read()


def test_corpus_source_is_held_out_of_pretraining():
  # Read as data.prepare reads the demo's corpus ("bundled", sentences
  # format, eval_fraction 0.02): its reader, its document order.
  docs = documents_lib.read_sentence_files(documents_lib.expand_paths(
      documents_lib.corpus_pattern("bundled")))
  held_out, pre_trained = {}, set()
  for index, doc in enumerate(docs):
    if is_eval_document(index, 0.02):
      held_out.update((s, index) for s in doc)
    else:
      pre_trained.update(doc)
  rows = task_rows()
  texts = [text for _, text in rows]
  assert len(set(texts)) == len(texts) == 1033
  assert collections.Counter(label for label, _ in rows) == {
      "moby_dick": 233, "python_docs": 400, "sotu": 400}
  assert not set(texts) & pre_trained
  assert all(text in held_out and len(text.split()) >= 8 for text in texts)
