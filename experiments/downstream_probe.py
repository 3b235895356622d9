r"""Why the demo's pre-training does not help its fine-tunes: a probe.

Builds a small in-domain task from the pre-training corpus's held-out
documents (the 2% `data.prepare` holds out by document hash, so no
sentence was pre-trained on): each sentence of 8 or more words labelled
with its source (moby_dick, python_docs, sotu), at most 400 a source.
Then, for a pre-trained workdir, fits a logistic regression on the
model's [CLS] pooler output, on its mean-pooled sequence output, and on
bag-of-words counts, with 62 and 300 training rows, and prints test
accuracy (rows 600 on) and how much the pooled output varies across rows.

  python experiments/downstream_probe.py --out=/tmp/source.tsv \
      --workdir=/tmp/albert_demo
  # the same task fine-tuned, pre-trained against random init (6% train):
  python -m albert_jax.main --config=configs/demo.py --workdir=COPY \
      --config.finetune.data.split_from=/tmp/source.tsv \
      "--config.finetune.data.split_fractions=(0.06,0.24,0.7)" \
      "--config.finetune.predict_texts=()"

COPY: a copy of the demo's finished workdir without its finetune*
folders. Needs scikit-learn.
"""

import argparse
import glob
import gzip
import os
import random

import numpy as np

import albert_jax
from albert_jax.data.shards import is_eval_document

CORPUS = os.path.join(os.path.dirname(albert_jax.__file__), "data",
                      "bundled", "corpus", "*.txt.gz")


def build(out: str, eval_fraction: float = 0.02, per_source: int = 400,
          seed: int = 0) -> list[tuple[str, str]]:
  """Writes `out` (TSV: label, text) and returns its rows."""
  index, by_source = 0, {}
  for path in sorted(glob.glob(CORPUS)):  # the order data.prepare reads
    name = os.path.basename(path).split(".")[0]
    with gzip.open(path, "rt", encoding="utf-8") as f:
      docs = f.read().rstrip("\n").split("\n\n")
    for doc in docs:
      if is_eval_document(index, eval_fraction):
        by_source.setdefault(name, []).extend(
            s for s in doc.split("\n") if len(s.split()) >= 8)
      index += 1
  rng = random.Random(seed)
  rows = []
  for name, sentences in sorted(by_source.items()):
    rng.shuffle(sentences)
    rows += [(name, s) for s in sentences[:per_source]]
  rng.shuffle(rows)
  with open(out, "w", encoding="utf-8") as f:
    f.write("label\ttext\n")
    f.writelines(f"{label}\t{text}\n" for label, text in rows)
  print(f"{out}: {len(rows)} rows", {k: min(len(v), per_source)
                                      for k, v in by_source.items()})
  return rows


def probe(workdir: str, rows: list[tuple[str, str]]) -> None:
  from sklearn.feature_extraction.text import CountVectorizer  # pylint: disable=g-import-not-at-top
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top
  labels = [label for label, _ in rows]
  texts = [" ".join(text.split()[:50]) for _, text in rows]  # fits 128
  model = albert_jax.load_pretrained(workdir)
  features = {p: model.embed(texts, pooling=p) for p in ("pooled", "mean")}
  features["bag of words"] = CountVectorizer().fit_transform(texts)
  print(f"pooled output: spread across rows {features['pooled'].std(0).mean():.4f}, "
        f"mean magnitude {np.abs(features['pooled']).mean():.4f}")
  print("| features | 62 training rows | 300 training rows |\n|---|---|---|")
  for name, x in features.items():
    accs = [LogisticRegression(max_iter=2000).fit(x[:n], labels[:n])
            .score(x[600:], labels[600:]) for n in (62, 300)]
    print(f"| {name} | {accs[0]:.3f} | {accs[1]:.3f} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--workdir", default="")
  args = parser.parse_args()
  rows = build(args.out)
  if args.workdir:
    probe(args.workdir, rows)


if __name__ == "__main__":
  main()
