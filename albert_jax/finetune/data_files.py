"""The data files a fine-tuning run reads: cutting one labelled file into
stratified train/eval/test files (`split_file`; `data.split_from`, and
`python -m albert_jax.finetune.data_files split IN OUT_DIR`), and refusing
to rerun a workdir on other data than it was trained on (`check_data`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
from typing import Optional, Sequence

import jax
import numpy as np

from albert_jax import storage
from albert_jax.finetune import tabular
from albert_jax.training import recipe

log = logging.getLogger(__name__)


def _apportion(n: int, fractions: Sequence[float]) -> list[int]:
  """Largest-remainder rounding of n·fractions to integers summing to n."""
  exact = [f * n for f in fractions]
  counts = [math.floor(e) for e in exact]
  by_remainder = sorted(range(len(exact)),
                        key=lambda i: (counts[i] - exact[i], i))
  for i in by_remainder[:n - sum(counts)]:
    counts[i] += 1
  return counts


def split_file(path: str, out_dir: str,
               fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0,
               *, label_column: str = "label",
               header: Optional[Sequence[str]] = None) -> dict[str, dict]:
  """Cuts a labelled file into train/eval/test files, stratified by label.

  Each label's rows are shuffled with `seed` and dealt out by `fractions`
  (largest-remainder rounding), so every split keeps the label balance;
  rows keep their original order within a file. Same input and seed, same
  output bytes.

  Args:
    path: a TSV/CSV/JSONL(.gz) file.
    out_dir: where train/eval/test.<same extension> go.
    fractions: train, eval and test shares, each > 0, summing to 1.
    seed: the shuffle's seed.
    label_column: the column to stratify by.
    header: column names for a TSV/CSV without a header row (the outputs
      then have none either).

  Returns:
    split → {"path": str, "rows": int, "labels": {label: rows}}.
  """
  fractions = tuple(float(f) for f in fractions)
  if len(fractions) != 3 or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-6:
    raise ValueError(f"fractions={fractions}: give three positive shares "
                     "(train, eval, test) that sum to 1.")
  table = tabular.read_table(path, header, "split_file input")
  keys = tabular.label_keys(
      tabular.column(table, label_column, "split_file input", "label_column"),
      f"split_file input {path}", table.lines)
  groups: dict[str, list[int]] = {}
  for i, key in enumerate(keys):
    groups.setdefault(key, []).append(i)
  tabular.check_case_variants({k: len(v) for k, v in groups.items()},
                              f"split_file input {path}")
  rng = np.random.default_rng(seed)
  parts: list[list[int]] = [[], [], []]
  for key in tabular.sorted_labels(groups):
    members = rng.permutation(groups[key])
    start = 0
    for part, count in zip(parts, _apportion(len(members), fractions)):
      part.extend(int(m) for m in members[start:start + count])
      start += count
  suffix = tabular.file_format(path) + (
      ".gz" if path.endswith(".gz") else "")
  storage.path(out_dir).mkdir(parents=True, exist_ok=True)
  result = {}
  for name, part in zip(("train", "eval", "test"), parts):
    part.sort()
    out = os.fspath(storage.path(out_dir) / (name + suffix))
    tabular.write_table(out, dataclasses.replace(
        table, path=out, rows=[table.rows[i] for i in part],
        lines=[table.lines[i] for i in part]))
    counts = {k: 0 for k in tabular.sorted_labels(groups)}
    for i in part:
      counts[keys[i]] += 1
    result[name] = {"path": out, "rows": len(part), "labels": counts}
  return result


def split_files(data, out_dir: str, write: bool, *, seed: int
                ) -> dict | None:
  """Points the `config.data` section `data`'s train/eval/test files at
  `out_dir/{train,eval,test}.<ext>`, the stratified split of
  `data.split_from` (`split_file`: `data.split_fractions`,
  `data.label_column`, `seed`, the run's `config.seed`), which `write`
  writes there.

  Returns:
    split → {"path", "rows", "labels"} where written, else None.
  """
  source = data.split_from
  if source.startswith("bundled/"):
    # A file shipped inside the package, not a user path.
    source = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                          "data", source)
  parts = split_file(
      source, out_dir, tuple(data.split_fractions), seed=seed,
      label_column=data.label_column) if write else None
  suffix = tabular.file_format(source) + (
      ".gz" if source.endswith(".gz") else "")
  with data.unlocked():
    for name in ("train", "eval", "test"):
      data[f"{name}_file"] = os.fspath(
          storage.path(out_dir) / (name + suffix))
  return parts


def split_in_workdir(data, workdir: str, *, seed: int) -> None:
  """With `data.split_from` in a run's `config.data` section `data` (a
  labelled TSV/CSV/JSONL file; "bundled/..." names one shipped in
  albert_jax/data/bundled), cuts it into stratified
  WORKDIR/data/{train,eval,test} files (`data.split_fractions`, seed
  `config.seed`) and points `data`'s files at them; nothing without. The
  fine-tuning run calls it holding the workdir's lease, so a second launch
  never rewrites the files a running one reads; the first process writes,
  every process waits for it."""
  if not data.get("split_from"):
    return
  out_dir = os.fspath(storage.path(workdir) / "data")
  parts = split_files(data, out_dir, write=jax.process_index() == 0,
                      seed=seed)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices("finetune data split")
  if parts is not None:
    log.info("Split %s into %s.", data.split_from, ", ".join(
        f"{k} {v['rows']} rows {v['labels']}" for k, v in parts.items()))


# The data files a fine-tuning run reads, which its recipe fingerprints.
DATA_FILES = ("data.train_file", "data.eval_file", "data.test_file")


def check_data(data, workdir: str, *, seed: int) -> None:
  """Refuses to rerun a fine-tuning workdir on other data than its run's.

  A run's checkpoints, predictions and final_metrics.json belong to the data
  it read: rerun on other files, a finished run used to re-evaluate, report
  "Fine-tuned on <new file>" and rewrite final_metrics.json. The files'
  fingerprints in the workdir's recipe (`recipe.RECIPE`) are compared with
  those of the files the run's `config.data` section `data` names; with
  `data.split_from` not yet split, with those of its split (by `seed`, the
  run's `config.seed`), cut into a temporary directory on this machine, so
  nothing in the workdir is written (and every process decides alike).

  Raises:
    recipe.RecipeError: one line naming the workdir, the data it was
      trained on (its config.json) and the fix.
  """
  path = storage.path(workdir) / recipe.RECIPE
  kept = recipe.read(workdir)
  if kept is None:
    return  # a new run
  was = kept.get("files") if isinstance(kept.get("files"), dict) else {}
  if not any(k in was for k in DATA_FILES):
    return  # a TFDS task: no data files
  if data.get("split_from") and not data.get("train_file"):
    import tempfile  # pylint: disable=g-import-not-at-top
    with tempfile.TemporaryDirectory() as tmp:
      split = data.copy_and_resolve_references()
      split_files(split, tmp, write=True, seed=seed)
      now = recipe.data_files(split, workdir)
  else:
    now = recipe.data_files(data, workdir)
  if all(was.get(k) == now.get(k) for k in DATA_FILES):
    return
  recorded = _recorded_data(workdir)
  if data.get("split_from") and not data.get("train_file"):
    given = f"data.split_from={data.split_from}"
  else:
    changed = []
    for key in DATA_FILES:
      if was.get(key) != now.get(key):
        value = data.get(key[len("data."):]) or "none"
        same = value == recorded.get(key)
        changed.append(f"{key}={value}"
                       + (" (its content changed)" if same else ""))
    given = ", ".join(changed)
  if recorded.get("data.split_from"):
    trained = f"data.split_from={recorded['data.split_from']}"
  else:
    trained = ", ".join(f"{k}={recorded[k]}" for k in DATA_FILES
                        if recorded.get(k)) or f"the files {path} records"
  raise recipe.RecipeError(
      f"{workdir} was fine-tuned on {trained}, and this run gives other "
      f"data ({given}); its checkpoints, predictions and final_metrics.json "
      "belong to the data it was trained on. Fine-tune on the new data in a "
      "new workdir (another --workdir), or rerun with the original files.")


def _recorded_data(workdir: str) -> dict[str, str]:
  """The data files a workdir's config.json (`run_setup.record_config`) names,
  by dotted key ({} where it cannot be read)."""
  try:
    data = json.loads((storage.path(workdir) / "config.json").read_text(
        encoding="utf-8")).get("data", {})
  except (OSError, ValueError, AttributeError):
    return {}
  return {f"data.{k}": v for k, v in data.items()
          if k in ("split_from", "train_file", "eval_file", "test_file")
          and isinstance(v, str) and v}


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI: `split IN OUT_DIR` writes stratified train/eval/test files."""
  parser = argparse.ArgumentParser(prog="python -m albert_jax.finetune.data_files")
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("split", help="stratified train/eval/test files")
  p.add_argument("input")
  p.add_argument("out_dir")
  p.add_argument("--fractions", default="0.8,0.1,0.1")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--label_column", default="label")
  args = parser.parse_args(argv)
  try:
    result = split_file(args.input, args.out_dir,
                        [float(f) for f in args.fractions.split(",")],
                        args.seed, label_column=args.label_column)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  for name, info in result.items():
    shares = ", ".join(f"{k} {v}" for k, v in info["labels"].items())
    print(f"{info['path']}: {info['rows']} rows ({shares})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
