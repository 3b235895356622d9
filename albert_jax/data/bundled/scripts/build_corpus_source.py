#!/usr/bin/env python3
r"""Builds labeled/corpus_source.tsv.gz: which corpus a held-out sentence is from.

A downstream task for models pre-trained on the bundled corpus: each row is
one sentence of 8 or more words, labelled with its corpus (moby_dick,
python_docs or sotu). The sentences come only from the documents that
`data.prepare` holds out of pre-training at `data.eval_fraction=0.02` (the
demo's; chosen by document index, `albert_jax.data.shards.is_eval_document`,
over the corpus files in sorted order, the order `data.prepare` reads them),
so a model pre-trained with that fraction has seen none of them (a sentence
that a pre-training document also holds, as some repeated in the Python
"What's New" files, is left out, and so is a second copy). At most 400
sentences a corpus, chosen with `random.Random(0)`, then shuffled.

  python albert_jax/data/bundled/scripts/build_corpus_source.py \
      albert_jax/data/bundled

rewrites DATA_DIR/labeled/corpus_source.tsv.gz (gzip mtime 0, no stored
name: the same bytes on every run). The text is the corpus's, so each row
keeps its corpus's licence (README.md).
"""

import argparse
import gzip
import io
import os
import random

from albert_jax.text import documents as documents_lib
from albert_jax.data.shards import is_eval_document

EVAL_FRACTION = 0.02  # configs/demo.py's data.eval_fraction
MIN_WORDS = 8
PER_SOURCE = 400
SEED = 0


def rows(data_dir: str) -> list[tuple[str, str]]:
  """(label, sentence) rows of the task, in file order."""
  index, held_out, pre_trained = 0, {}, set()
  # data.prepare's reader, file by file in its order, so the document
  # indices are the ones its held-out choice sees.
  for path in documents_lib.expand_paths(
      os.path.join(data_dir, "corpus", "*.txt.gz")):
    name = os.path.basename(path).split(".")[0]
    for doc in documents_lib.read_sentence_files([path]):
      if is_eval_document(index, EVAL_FRACTION):
        held_out.setdefault(name, []).extend(
            s for s in doc if len(s.split()) >= MIN_WORDS)
      else:
        pre_trained.update(doc)
      index += 1
  rng = random.Random(SEED)
  out, seen = [], set(pre_trained)
  for name, candidates in sorted(held_out.items()):
    sentences = []
    for s in candidates:
      if s not in seen:
        seen.add(s)
        sentences.append(s)
    rng.shuffle(sentences)
    out += [(name, s) for s in sentences[:PER_SOURCE]]
  rng.shuffle(out)
  return out


def tsv_bytes(table: list[tuple[str, str]]) -> bytes:
  """The gzip-compressed TSV (header `label<TAB>text`) of `table`."""
  text = "label\ttext\n" + "".join(f"{label}\t{s}\n" for label, s in table)
  buf = io.BytesIO()
  with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as f:
    f.write(text.encode("utf-8"))
  return buf.getvalue()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("data_dir", help="the bundle folder (corpus/ inside)")
  args = parser.parse_args()
  table = rows(args.data_dir)
  out = os.path.join(args.data_dir, "labeled", "corpus_source.tsv.gz")
  with open(out, "wb") as f:
    f.write(tsv_bytes(table))
  counts = {}
  for label, _ in table:
    counts[label] = counts.get(label, 0) + 1
  print(f"{out}: {len(table)} rows {dict(sorted(counts.items()))}")


if __name__ == "__main__":
  main()
