"""A run's recipe: recorded in its workdir, checked when the run resumes.

Without it, a rerun in the same workdir with an architecture that keeps the
weight shapes (more layers under share=all, another activation), another
corpus or another tokenizer of the same size would silently go on training
something else from the same checkpoint.

WORKDIR/recipe.json holds
  - "config": every config field, as dotted keys, except those a resumed run
    may change (`MAY_CHANGE`) and those that name files;
  - "files": a content fingerprint of every file the config's `data` section
    names (corpus globs, the tokenizer, fine-tuning files; a prepared
    data_dir's dataset.json), and of the tokenizer the run trained into the
    workdir. A file may move (another path, a copy in another bucket); its
    content may not change;
  - "num_train_steps", which may grow but not shrink;
  - "rows_per_step", for a packed pre-training run: the rows a step takes
    to hold `batch_size` instances, fixed when the run starts and kept by
    every resume (whatever the mesh), so its batches stay the same;
  - under "config", "data.mixture": the inputs, formats and weights a
    prepared data_dir was mixed from (its dataset.json's "mixture"), so a
    resume on data mixed otherwise names the weights that changed.

`check` runs before anything is written: a rerun whose recipe differs is
refused with the differences listed, and the workdir is left as it was.
`record` writes the recipe once the state is restored or created.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping

import jax

from albert_jax import storage
from albert_jax.text import documents as documents_lib
from albert_jax.text import run_tokenizer

RECIPE = "recipe.json"

# What a resumed run may change: cadences, evaluation and retention, how
# the step is laid out on devices (a checkpoint restores onto any mesh, and
# accumulation gives the same gradient), host-side data workers, and a
# pre-training config's fine-tuning stage (a run of its own, in its own
# workdir, with its own recipe). num_train_steps may grow.
MAY_CHANGE = (
    "log_every_steps", "eval_every_steps", "eval_batches", "eval_batch_size",
    "checkpoint_every_steps", "keep_checkpoints", "async_checkpoints",
    "best_metric", "max_consecutive_nonfinite", "peak_tflops_per_device",
    "fast_compile", "mesh", "sharding_rules", "accumulation_steps",
    "data.num_workers", "data.prefetch", "model.remat", "model.attention_impl",
    "model.layer_loop",
    "finetune", "take_over_workdir", "num_train_steps", "profile",
    "goodput",
    # A fine-tuning run's starting weights: read only when it starts fresh.
    "init")
# Read in blocks from both ends of a file: enough to tell a changed corpus or
# tokenizer from the same one, without reading gigabytes on every start.
_BLOCK = 1 << 20


class RecipeError(ValueError):
  """A rerun whose recipe differs from the one its checkpoints were
  trained with."""


def _fingerprint(path: str) -> str:
  """"size:sha256" of a file's first and last MiB; for a directory, of each
  of its files by name. Local or gs://."""
  p = storage.path(path)
  if p.is_dir():
    digest = hashlib.sha256()
    for child in sorted(p.iterdir(), key=lambda c: c.name):
      if child.is_file():
        digest.update(f"{child.name}={_fingerprint(os.fspath(child))};"
                      .encode())
    return "dir:" + digest.hexdigest()[:32]
  digest = hashlib.sha256()
  with p.open("rb") as f:
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    digest.update(f.read(_BLOCK))
    if size > 2 * _BLOCK:
      f.seek(size - _BLOCK)
    digest.update(f.read())
  return f"{size}:{digest.hexdigest()[:32]}"


def _named_files(key: str, value: Any) -> list[str] | None:
  """The files a `data` field names, or None if it names none (a number,
  a TFDS dataset, an empty path)."""
  if not isinstance(value, str) or not value:
    return None
  if key == "data.corpus":
    value = documents_lib.corpus_pattern(value)
  if key == "data.data_dir":
    metadata = storage.path(value) / "dataset.json"
    return [os.fspath(metadata)] if metadata.is_file() else None
  if storage.path(value).exists():
    return [os.fspath(storage.path(value))]
  try:  # globs exactly as the corpus reader expands them
    return documents_lib.expand_paths(value)
  except FileNotFoundError:
    return None


def _mixture(data_dir: Any) -> list[dict[str, Any]] | None:
  """The inputs and weights a prepared data_dir was mixed from (as
  `albert_jax.data.prepare` recorded them), or None."""
  if not isinstance(data_dir, str) or not data_dir:
    return None
  path = storage.path(data_dir) / "dataset.json"
  if not path.is_file():
    return None
  try:
    mixture = json.loads(path.read_text(encoding="utf-8")).get("mixture")
  except (ValueError, AttributeError):
    return None  # the loader names a damaged dataset.json itself
  if not isinstance(mixture, list):
    return None  # prepared before mixtures were recorded
  return [{k: m.get(k) for k in ("input", "format", "weight")}
          for m in mixture if isinstance(m, dict)]


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, Mapping):
      out.update(_flatten(value, name + "."))
    else:
      out[name] = list(value) if isinstance(value, tuple) else value
  return out


def _may_change(key: str) -> bool:
  return any(key == k or key.startswith(k + ".") for k in MAY_CHANGE)


def _files(values: Mapping[str, Any], workdir: str) -> dict[str, list[str]]:
  """The recipe's "files" of a config's JSON values: data.KEY → the
  fingerprints of the files its `data` section's KEY names, and of the
  tokenizer trained into `workdir` where none is configured."""
  files = {}
  for key, value in _flatten(values).items():
    if key.startswith("data."):
      named = _named_files(key, value)
      if named is not None:
        files[key] = [_fingerprint(p) for p in named]
  if "data.tokenizer" not in files and "data" in values:
    try:
      own = run_tokenizer.workdir_path(values["data"] or {}, workdir)
    except ValueError:  # a bad tokenizer_type: the run reports it itself
      own = None
    if own and storage.path(own).exists():
      files["data.tokenizer"] = [_fingerprint(own)]
  return files


def data_files(data, workdir: str) -> dict[str, list[str]]:
  """The "files" of the recipe of a run in `workdir` whose `config.data`
  section is `data` (a ConfigDict): they come from that section alone."""
  return _files({"data": json.loads(data.to_json_best_effort())}, workdir)


def recipe(config, workdir: str) -> dict[str, Any]:
  """The recipe of `config`'s run in `workdir` (see the module docstring)."""
  values = json.loads(config.to_json_best_effort())
  flat = _flatten(values)
  files = _files(values, workdir)
  config = {k: v for k, v in flat.items()
            if not _may_change(k) and k not in files}
  mixture = _mixture(flat.get("data.data_dir"))
  if mixture is not None:
    config["data.mixture"] = mixture
  return {"config": config,
          "files": files,
          "num_train_steps": values.get("num_train_steps")}


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  lines = []
  # Only fields both sides have: a field that a later version of the code
  # added (or removed) is not a change the user made.
  for key in sorted(set(old["config"]) & set(new["config"])):
    was, now = old["config"][key], new["config"][key]
    if was != now:
      lines.append(f"  {key}: {was!r} → {now!r}")
  for key in sorted(set(old["files"]) | set(new["files"])):
    was, now = old["files"].get(key), new["files"].get(key)
    if was != now:
      what = ("no longer found" if now is None else
              "was not recorded" if was is None else
              f"{len(was)} → {len(now)} files" if len(was) != len(now) else
              "content changed")
      lines.append(f"  {key}: {what}")
  was, now = old.get("num_train_steps"), new.get("num_train_steps")
  if was is not None and now is not None and now < was:
    lines.append(f"  num_train_steps: {was} → {now} (it may grow, not "
                 "shrink: the learning-rate schedule has run past it)")
  return lines


def read(workdir: str) -> dict | None:
  """The recipe recorded in `workdir`, None if none is.

  Raises:
    storage.DamagedFileError: recipe.json is not a JSON object, naming it
      and the fix.
  """
  path = storage.path(workdir) / RECIPE
  if not path.is_file():
    return None
  return storage.read_json_object(
      path, "it records the recipe this workdir was trained with, so a "
      "resume can be checked against it: restore it, or delete it to resume "
      "without that check (the next run records it anew).")


def check(config, workdir: str) -> None:
  """Refuses to resume `workdir` with another recipe; writes nothing.

  Raises:
    RecipeError: the differences, one per line, and what to do.
  """
  old = read(workdir)
  if old is None:
    return  # a new run, or one from before recipes were recorded
  path = storage.path(workdir) / RECIPE
  lines = _differences(old, recipe(config, workdir))
  if lines:
    raise RecipeError(
        f"{workdir} holds a run trained with another recipe; refusing to "
        "resume it with:\n" + "\n".join(lines) + "\nRerun with the recorded "
        f"values ({path}), or start in a new workdir. Fields that may change "
        f"on resume: {', '.join(MAY_CHANGE)} (num_train_steps upwards).")


def record(config, workdir: str, rows_per_step: int | None = None) -> None:
  """Writes WORKDIR/recipe.json (process 0 only), with `rows_per_step`
  where given (a packed pre-training run's)."""
  if jax.process_index() != 0:
    return
  values = recipe(config, workdir)
  if rows_per_step is not None:
    values["rows_per_step"] = rows_per_step
  storage.write_atomic(storage.path(workdir) / RECIPE, json.dumps(
      values, indent=2, sort_keys=True))
