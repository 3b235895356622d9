r"""How much of a downstream task a pre-trained model's features hold: a probe.

On the bundled corpus-source task (albert_jax/data/bundled/labeled/
corpus_source.tsv.gz: which corpus a sentence from a held-out document comes
from; no sentence was pre-trained on), fits a logistic regression on the
model's [CLS] pooler output, on its mean-pooled sequence output, and on
bag-of-words counts, with 62 and 300 training rows, and prints test
accuracy (rows 600 on) and how much the pooled output varies across rows.

  python experiments/downstream_probe.py --workdir=workdirs/demo

The same task fine-tuned, pre-trained against random init, is the demo's
(configs/demo.py, task=source). Needs scikit-learn.
"""

import argparse
import gzip
import os

import numpy as np

import albert_jax

TASK = os.path.join(os.path.dirname(albert_jax.__file__), "data", "bundled",
                    "labeled", "corpus_source.tsv.gz")


def read_task() -> list[tuple[str, str]]:
  """(label, text) rows of the bundled corpus-source task."""
  with gzip.open(TASK, "rt", encoding="utf-8") as f:
    return [tuple(line.rstrip("\n").split("\t")) for line in f][1:]


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
  parser.add_argument("--workdir", required=True,
                      help="a pre-training workdir (or anything "
                      "albert_jax.load_pretrained takes)")
  args = parser.parse_args()
  probe(args.workdir, read_task())


if __name__ == "__main__":
  main()
