"""The data files a fine-tuning run reads: cutting one labelled file into
train/eval/test (`data.split_from`), and refusing to rerun a workdir on
other data than it was trained on (`check_data`)."""

from __future__ import annotations

import json
import os

from albert_jax import storage
from albert_jax.training import recipe


def split_files(config, out_dir: str, write: bool) -> dict | None:
  """Points `config.data`'s train/eval/test files at
  `out_dir/{train,eval,test}.<ext>`, the stratified split of
  `data.split_from` (`tabular.split_file`), which `write` writes there.

  Returns:
    split → {"path", "rows", "labels"} where written, else None.
  """
  from albert_jax.finetune import tabular  # pylint: disable=g-import-not-at-top
  source = config.data.split_from
  if source.startswith("bundled/"):
    # A file shipped inside the package, not a user path.
    source = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                          "data", source)
  parts = tabular.split_file(
      source, out_dir, tuple(config.data.split_fractions), seed=config.seed,
      label_column=config.data.label_column) if write else None
  suffix = tabular.file_format(source) + (
      ".gz" if source.endswith(".gz") else "")
  with config.unlocked():
    for name in ("train", "eval", "test"):
      config.data[f"{name}_file"] = os.fspath(
          storage.path(out_dir) / (name + suffix))
  return parts


# The data files a fine-tuning run reads, which its recipe fingerprints.
DATA_FILES = ("data.train_file", "data.eval_file", "data.test_file")


def check_data(config, workdir: str) -> None:
  """Refuses to rerun a fine-tuning workdir on other data than its run's.

  A run's checkpoints, predictions and final_metrics.json belong to the data
  it read: rerun on other files, a finished run used to re-evaluate, report
  "Fine-tuned on <new file>" and rewrite final_metrics.json. The files'
  fingerprints in the workdir's recipe (`recipe.RECIPE`) are compared with
  those of the files `config` names; with `data.split_from` not yet split,
  with those of its split, cut into a temporary directory on this machine,
  so nothing in the workdir is written (and every process decides alike).

  Raises:
    recipe.RecipeError: one line naming the workdir, the data it was
      trained on (its config.json) and the fix.
  """
  path = storage.path(workdir) / recipe.RECIPE
  if not path.is_file():
    return  # a new run
  was = json.loads(path.read_text(encoding="utf-8")).get("files", {})
  if not any(k in was for k in DATA_FILES):
    return  # a TFDS task: no data files
  data = config.data
  if data.get("split_from") and not data.get("train_file"):
    import tempfile  # pylint: disable=g-import-not-at-top
    with tempfile.TemporaryDirectory() as tmp:
      split = config.copy_and_resolve_references()
      split_files(split, tmp, write=True)
      now = recipe.recipe(split, workdir)["files"]
  else:
    now = recipe.recipe(config, workdir)["files"]
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
  """The data files a workdir's config.json (`loop.record_config`) names,
  by dotted key ({} where it cannot be read)."""
  try:
    data = json.loads((storage.path(workdir) / "config.json").read_text(
        encoding="utf-8")).get("data", {})
  except (OSError, ValueError, AttributeError):
    return {}
  return {f"data.{k}": v for k, v in data.items()
          if k in ("split_from", "train_file", "eval_file", "test_file")
          and isinstance(v, str) and v}
