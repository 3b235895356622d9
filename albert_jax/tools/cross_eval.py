r"""Evaluate pre-trained runs on each other's held-out data: the paper's Table 5.

  python -m albert_jax.tools.cross_eval RUN_DIR... [--eval_batches=N] [--out=DIR]
  python -m albert_jax.tools.cross_eval /tmp/ablate_objective/*/ --out=/tmp/ablate_objective

The ALBERT paper evaluates every model of its sentence-objective ablation
(none / NSP / SOP) on MLM, NSP and SOP accuracy alike: an NSP-trained
sentence head scored on sentence-order pairs and the reverse. A trial of
`experiments/ablate_sentence_objective.py` holds its own prepared data
(WORKDIR/data, or config.data.data_dir); this tool scores each run's final
parameters on the eval split of every run's data with another sentence
objective, with the run's own masking. NSP and SOP share one two-way
head ("sop" in the parameters), so the head of either objective answers
the other's pairs. A run trained with objective "none" has no sentence head:
its NSP and SOP cells are empty, never a guess.

The runs must share one tokenizer (the sweep's trials train the same
SentencePiece model from the same corpus and seed); a run whose tokenizer
differs from a dataset's is refused by name. Writes DIR/cross_eval.md (and
.json) and prints the table. Paths are local or gs://.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

import jax
import numpy as np

from albert_jax import storage
from albert_jax.data import loader as loader_lib
from albert_jax.data import pipeline
from albert_jax.interop import pretrained as pretrained_lib
from albert_jax.model import albert as albert_lib
from albert_jax.training import defaults
from albert_jax.training import objectives

SENTENCE_OBJECTIVES = ("nsp", "sop")
TABLE_FILE = "cross_eval.md"


class CrossEvalError(ValueError):
  """A run or dataset that cannot be scored as asked."""


def data_dir(run_dir: str, data: dict[str, Any]) -> str:
  """Where a run's prepared data is: its `config.data` section's data_dir,
  or WORKDIR/data."""
  return str(data.get("data_dir") or "") or f"{run_dir}/data"


def data_objective(directory: str) -> str:
  """The sentence objective a prepared directory was made for."""
  return loader_lib.read_metadata(directory).get("config", {}).get(
      "objective", "sop")


def evaluate_on(model: pretrained_lib.Pretrained, config: dict[str, Any],
                directory: str, eval_batches: int) -> dict[str, float]:
  """MLM (and sentence-head) accuracy of `model` on `directory`'s eval split.

  Batches are masked with the run's own masking recipe and seed + 1, as the
  trainer's evaluation does, `eval_batches` batches of the run's batch size.
  """
  if not pipeline.has_split(directory, "eval"):
    raise CrossEvalError(f"{directory} has no eval split; prepare it with "
                         "data.eval_fraction > 0.")
  cfg = _config_dict(config)
  loader = pipeline.make_loader(
      cfg.data, cfg.masking, directory, "eval",
      loader_lib.Vocabulary.from_tokenizer(model.tokenizer), sharding=None,
      global_batch_size=cfg.batch_size, seed=cfg.seed + 1)
  module = albert_lib.Albert(model.model_config, pooler=model.pooler,
                             heads=tuple(h for h in model.heads
                                         if h in ("mlm", "sop")))
  # The loader's rows: one instance, then padding.
  objective = objectives.MaskedLMObjective(module, right_padded=True)
  sums_fn = jax.jit(lambda p, b: objective.sums(p, b, None, True))
  total = None
  for step in range(eval_batches):
    sums = jax.device_get(sums_fn(model.params, loader.local_batch(step)))
    total = sums if total is None else jax.tree.map(np.add, total, sums)
  out = {k: float(v) for k, v in objective.metrics(total).items()}
  return {k: v for k, v in out.items() if k.endswith("accuracy")}


def _config_dict(config: dict[str, Any]):
  import ml_collections  # pylint: disable=g-import-not-at-top
  return ml_collections.ConfigDict(config)


def _same_tokenizer(model, directory: str) -> bool:
  recorded = loader_lib.read_metadata(directory).get("tokenizer", "")
  if not recorded or not storage.path(recorded).exists() or not model.tokenizer:
    return False
  return storage.path(recorded).read_bytes() == storage.path(
      model.tokenizer.path).read_bytes()


def cross_evaluate(run_dirs: Sequence[str], eval_batches: int = 0
                   ) -> list[dict[str, Any]]:
  """One row per run: its objective, and `mlm_accuracy`, `nsp_accuracy` and
  `sop_accuracy` on the data of each objective that the runs hold (None
  where the run has no sentence head). MLM accuracy is read on the run's
  own data. `eval_batches` 0 takes each run's config.eval_batches."""
  runs = []
  for run_dir in run_dirs:
    run_dir = os.fspath(run_dir).rstrip("/")
    config_path = storage.path(run_dir) / "config.json"
    if not config_path.exists():
      raise CrossEvalError(f"{run_dir} has no config.json; give pre-training "
                           "workdirs (e.g. a sweep's WORKDIR_ROOT/*/).")
    config = defaults.upgrade(json.loads(config_path.read_bytes()))
    runs.append((run_dir, config, data_dir(run_dir, config["data"])))
  datasets = {}
  for _, _, directory in runs:
    datasets.setdefault(data_objective(directory), directory)
  rows = []
  for run_dir, config, own in runs:
    model = pretrained_lib.load_pretrained(run_dir)
    batches = eval_batches or int(config["eval_batches"])
    row = {"run": storage.path(run_dir).name,
           "objective": config["data"]["objective"], "step": model.step,
           "mlm_accuracy": evaluate_on(model, config, own,
                                       batches)["mlm_accuracy"]}
    for objective in SENTENCE_OBJECTIVES:
      row[f"{objective}_accuracy"] = None
      directory = datasets.get(objective)
      if directory is None or "sop" not in model.heads:
        continue
      if not _same_tokenizer(model, directory):
        raise CrossEvalError(
            f"{run_dir}'s tokenizer differs from the one {directory} was "
            "prepared with; cross-evaluate runs that share a tokenizer (set "
            "config.data.tokenizer to one file for every trial).")
      row[f"{objective}_accuracy"] = evaluate_on(
          model, config, directory, batches)["sop_accuracy"]
    rows.append(row)
  return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
  """The rows as a markdown table, the paper's Table 5 columns."""
  def cell(v):
    return "—" if v is None else f"{v:.4f}"
  lines = ["| run | trained on | step | MLM acc. | NSP acc. | SOP acc. |",
           "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['run']} | {r['objective']} | {r['step']} | "
                 f"{cell(r['mlm_accuracy'])} | {cell(r['nsp_accuracy'])} | "
                 f"{cell(r['sop_accuracy'])} |")
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m albert_jax.tools.cross_eval",
      description=__doc__.split("\n\n")[0])
  parser.add_argument("runs", nargs="+", help="pre-training workdirs")
  parser.add_argument("--eval_batches", type=int, default=0,
                      help="batches per cell (default: each run's "
                      "config.eval_batches)")
  parser.add_argument("--out", default="",
                      help="write cross_eval.md and cross_eval.json here")
  args = parser.parse_args(argv)
  if args.eval_batches < 0:
    parser.error(f"--eval_batches={args.eval_batches}; give 0 (each run's "
                 "config.eval_batches) or more.")
  try:
    runs = []
    for spec in args.runs:
      if not (found := storage.glob(spec)):
        raise CrossEvalError(f"{spec} matches no directory; give "
                             "pre-training workdirs (e.g. a sweep's "
                             "WORKDIR_ROOT/*/).")
      runs += found
    rows = cross_evaluate(runs, args.eval_batches)
  except (CrossEvalError, FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  text = table(rows)
  print(text, end="")
  if args.out:
    out = storage.path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(out / TABLE_FILE, text)
    storage.write_atomic(out / "cross_eval.json", json.dumps(rows, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
