"""Reading checkpoints back: shape checks, resume, parameters only.

`restore_latest` resumes training from the newest readable checkpoint,
falling back to older ones (with a warning) when the newest is corrupt or
incomplete; `restore_params` reads only the parameters, onto one device,
for inference and fine-tuning. Both first compare the checkpoint's stored
shapes with the model's and raise CheckpointShapeError listing every
mismatched array. Saving and retention are in `albert_jax.checkpoints`,
which re-exports these names.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp

# The logger of `albert_jax.checkpoints`, which users know these messages by.
log = logging.getLogger("albert_jax.checkpoints")

CHECKPOINTS = "checkpoints"  # the subdirectory of a workdir


def checkpoint_dir(workdir: str) -> str:
  """Where a workdir's checkpoints live."""
  return os.path.join(os.path.abspath(os.fspath(workdir)), CHECKPOINTS)


class CheckpointShapeError(ValueError):
  """A checkpoint whose parameter shapes disagree with the model config.

  Attributes:
    step: the checkpoint's step.
    problems: (path, checkpoint shape or None, model shape or None) for every
      mismatched array; None where one side lacks the path.
  """

  def __init__(self, message: str, step: int,
               problems: Sequence[tuple[str, Any, Any]]):
    super().__init__(message)
    self.step = step
    self.problems = list(problems)


class UnreadableCheckpointError(RuntimeError):
  """Checkpoints exist, but none of them can be read."""


def _abstract(tree, shardings):
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree, shardings)


def _key_name(key) -> str:
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _target_shapes(tree) -> dict[str, tuple[int, ...]]:
  """"a/b/0/c" → shape for every array leaf, in orbax's path naming."""
  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    flat["/".join(_key_name(k) for k in path)] = tuple(np.shape(leaf))
  return flat


def _stored_shapes(mngr: ocp.CheckpointManager, step: int
                   ) -> dict[str, tuple[int, ...]]:
  """The state's array shapes as saved, read from the checkpoint metadata.

  Orbax stores tuples and lists as lists and named tuples (optax states) as
  dicts of their fields, which `_target_shapes` names the same way.
  """
  meta = mngr.item_metadata(step)["state"]
  tree = getattr(meta, "tree", meta)
  if tree is None:
    raise ValueError(f"checkpoint step {step} has no state metadata")
  flat = {}

  def walk(node, prefix):
    if isinstance(node, Mapping):
      items = node.items()
    elif isinstance(node, (list, tuple)):
      items = enumerate(node)
    else:
      if hasattr(node, "shape"):
        flat[prefix] = tuple(node.shape)
      return
    for k, v in items:
      walk(v, f"{prefix}/{k}" if prefix else str(k))
  walk(tree, "")
  return flat


def _shape_problems(stored: Mapping[str, tuple[int, ...]],
                    wanted: Mapping[str, tuple[int, ...]],
                    extra_under: Sequence[str] | None = None):
  """Mismatches as (path, stored shape or None, wanted shape or None).

  A stored array the target lacks counts only under `extra_under` prefixes
  (all of them when None): a partial restore ignores the rest.
  """
  problems = []
  for key, shape in wanted.items():
    if stored.get(key) != shape:
      problems.append((key, stored.get(key), shape))
  for key, shape in stored.items():
    if key in wanted:
      continue
    if extra_under is None or any(key == p or key.startswith(p + "/")
                                  for p in extra_under):
      problems.append((key, shape, None))
  return sorted(problems)


def _shape_error(directory, step: int, problems) -> CheckpointShapeError:
  # Parameters first: optimizer slots mirror them and say nothing new.
  problems = sorted(problems, key=lambda p: (not p[0].startswith("params/"),
                                             p[0]))
  num_params = sum(p[0].startswith("params/") for p in problems)
  lines = []
  for key, stored, wanted in problems[:30]:
    if stored is None:
      lines.append(f"  {key}: missing from the checkpoint (model {wanted})")
    elif wanted is None:
      lines.append(f"  {key}: in the checkpoint {stored}, not in the model")
    else:
      lines.append(f"  {key}: checkpoint {stored}, model {wanted}")
  if len(problems) > 30:
    lines.append(f"  ... and {len(problems) - 30} more")
  return CheckpointShapeError(
      f"Checkpoint step {step} in {directory} was written by a model of "
      "another shape (or with other heads / optimizer); "
      f"{len(problems)} mismatched arrays ({num_params} parameters):\n"
      + "\n".join(lines) + "\nUse the config the checkpoint was written "
      "with, or a new workdir.", step, problems)


def check_shapes(mngr: ocp.CheckpointManager, step: int, target: Any,
                 partial: bool = False) -> None:
  """Raises CheckpointShapeError listing every path whose shape differs.

  Args:
    mngr: the checkpoint manager.
    step: which checkpoint.
    target: the (abstract) state to restore into, or a subset of it
      (e.g. {"params": ...}) with `partial`.
    partial: only the target's top-level subtrees are compared; arrays the
      checkpoint holds elsewhere are ignored.
  """
  wanted = _target_shapes(target)
  extra_under = sorted(target) if partial else None
  problems = _shape_problems(_stored_shapes(mngr, step), wanted, extra_under)
  if problems:
    raise _shape_error(mngr.directory, step, problems)


def brief_error(error: BaseException, limit: int = 400) -> str:
  """An error's text cut short: tensorstore's embed kilobytes of spec."""
  text = " ".join(str(error).split())
  text = re.sub(r" ?\[tensorstore_spec=.*", "", text)
  return text if len(text) <= limit else text[:limit] + " …"


def _read_metadata(mngr, step, directory):
  """Stored shapes, or None (with a warning) when the metadata is unreadable."""
  try:
    return _stored_shapes(mngr, step)
  except Exception as e:  # pylint: disable=broad-except
    log.warning("Checkpoint step %d in %s has unreadable metadata (%s: %s); "
                "trying the previous one.", step, directory,
                type(e).__name__, brief_error(e))
    return None


def _set_aside(mngr: ocp.CheckpointManager, steps: Sequence[int]) -> None:
  """Renames unreadable checkpoints out of the manager's sight.

  Left in place, the manager would refuse to save those steps again (it
  skips a step that exists), so a re-trained final step would never be
  saved. Renamed, they are kept for inspection and ignored by orbax.
  """
  from etils import epath  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    root = epath.Path(mngr.directory)
    for step in steps:
      source = root / str(step)
      if not source.exists():
        continue
      dest, n = root / f"{step}.unreadable", 1
      while dest.exists():
        dest, n = root / f"{step}.unreadable-{n}", n + 1
      source.rename(dest)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices("albert_jax_checkpoints_set_aside")
  mngr.reload()


def restore_latest(mngr: ocp.CheckpointManager, abstract_state: Any,
                   shardings: Any) -> tuple[Any, dict] | None:
  """Restores the newest readable checkpoint onto `shardings`.

  Args:
    mngr: from `manager`.
    abstract_state: the state's structure (arrays or ShapeDtypeStructs).
    shardings: a matching tree of shardings to restore onto: any mesh, or a
      single device, whatever the checkpoint was saved from.

  Returns:
    (state, meta), or None when the workdir has no checkpoint.

  Raises:
    CheckpointShapeError: the checkpoint holds other shapes than the state
      (nothing would fit, so no older checkpoint is tried).
    UnreadableCheckpointError: there are checkpoints but none can be read;
      training from scratch over them would be a silent loss.
  """
  target = _abstract(abstract_state, shardings)
  wanted = _target_shapes(target)
  steps = sorted(mngr.all_steps(), reverse=True)
  failures = []
  for step in steps:
    stored = _read_metadata(mngr, step, mngr.directory)
    if stored is None:
      failures.append(step)
      continue
    problems = _shape_problems(stored, wanted)
    if problems:
      raise _shape_error(mngr.directory, step, problems)
    try:
      restored = mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target),
          meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except
      # orbax / tensorstore raise many kinds for missing or corrupt files.
      log.warning("Checkpoint step %d in %s could not be restored (%s: %s); "
                  "trying the previous one.", step, mngr.directory,
                  type(e).__name__, brief_error(e))
      failures.append(step)
      continue
    if failures:
      _set_aside(mngr, failures)
      log.warning("Resumed from checkpoint step %d in %s; the newer "
                  "unreadable checkpoint(s) %s were renamed to "
                  "<step>.unreadable so that training can save those steps "
                  "again.", step, mngr.directory, failures)
    return restored["state"], dict(restored["meta"] or {})
  if failures:
    raise UnreadableCheckpointError(
        f"None of the checkpoints {failures} in {mngr.directory} could be "
        "read (see the warnings above). Move them away to start from "
        "scratch, or restore them from a backup.")
  return None


def _read_only_manager(directory: str) -> ocp.CheckpointManager:
  # PyTreeCheckpointHandler reads what StandardSave wrote and allows a
  # partial restore (parameters without the optimizer state).
  return ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(read_only=True),
      item_handlers={"state": ocp.PyTreeCheckpointHandler(),
                     "meta": ocp.JsonCheckpointHandler()})


def available_steps(workdir: str) -> list[int]:
  """The complete checkpoints' steps in a workdir, ascending ([] if none)."""
  directory = checkpoint_dir(workdir)
  if not os.path.isdir(directory):
    return []
  return sorted(_read_only_manager(directory).all_steps())


def restore_params(workdir: str, abstract_params: Any,
                   step: int | None = None, sharding=None) -> tuple[Any, int]:
  """Only the parameters of a workdir's checkpoint, onto one device.

  The Colab case: no mesh, no optimizer state read.

  Args:
    workdir: a training workdir (holding `checkpoints/`).
    abstract_params: the parameters' structure (arrays or
      ShapeDtypeStructs), unboxed.
    step: which checkpoint; default the newest readable one (falling back
      to older ones with a warning).
    sharding: where to put them; default the first CPU device.

  Returns:
    (params, step).

  Raises:
    FileNotFoundError: no checkpoints, or none at `step`.
    CheckpointShapeError: the parameters' shapes differ from the checkpoint's.
    UnreadableCheckpointError: no checkpoint could be read.
  """
  directory = checkpoint_dir(workdir)
  mngr = (_read_only_manager(directory) if os.path.isdir(directory)
          else None)
  available = sorted(mngr.all_steps(), reverse=True) if mngr else []
  if not available:
    raise FileNotFoundError(
        f"No checkpoints in {directory}: the run has not saved one yet (or "
        "this is not a training workdir).")
  if step is not None:
    if int(step) not in available:
      raise FileNotFoundError(
          f"No checkpoint at step {step} in {directory}; available steps: "
          f"{sorted(available)}.")
    steps = [int(step)]
  else:
    steps = available
  sharding = sharding or jax.sharding.SingleDeviceSharding(
      jax.local_devices(backend="cpu")[0])
  target = {"params": jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
      abstract_params)}
  wanted = _target_shapes(target)
  failures = []
  for s in steps:
    stored = _read_metadata(mngr, s, directory)
    if stored is None:
      failures.append(s)
      continue
    problems = _shape_problems(stored, wanted, extra_under=["params"])
    if problems:
      raise _shape_error(directory, s, problems)
    try:
      restored = mngr.restore(s, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item=target,
              restore_args=ocp.checkpoint_utils.construct_restore_args(target),
              partial_restore=True)))
    except Exception as e:  # pylint: disable=broad-except
      log.warning("Checkpoint step %d in %s could not be read (%s: %s); "
                  "trying the previous one.", s, directory,
                  type(e).__name__, brief_error(e))
      failures.append(s)
      continue
    return restored["state"]["params"], s
  raise UnreadableCheckpointError(
      f"Checkpoint(s) {failures} in {directory} could not be read (see the "
      "warnings above).")


def to_numpy(tree):
  """The tree's arrays as NumPy arrays on the host."""
  return jax.tree.map(np.asarray, tree)
