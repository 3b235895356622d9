"""Orbax checkpoints of the train state: async saves, retention, resume.

Layout: `WORKDIR/checkpoints/<step>/{state, meta}` where `state` is the whole
train state ({"step", "params", "opt_state", "rng"}) and `meta` a JSON record
(data position, metrics). The data position is the step itself: the loader's
batch of step s is a pure function of (seed, s).

Retention keeps the newest `keep` checkpoints plus the best one by an eval
metric. A checkpoint is written to `<step>.orbax-checkpoint-tmp` and renamed
to `<step>` when complete, so a half-written one is never restored; if the
newest checkpoint fails to restore (corrupt or missing files), the previous
one is used with a warning. A write that fails (a full disk, say) raises
CheckpointWriteError naming the step and the intact checkpoints a rerun
resumes from. Restoring takes target shardings, so a checkpoint
saved on one mesh restores onto any other mesh, or onto one CPU device.

This module writes and retains checkpoints; reading them back (with shape
checks and the fallback to older ones) is `albert_jax.checkpoint_restore`,
whose public names are importable from here too.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp

from albert_jax.checkpoint_restore import available_steps
from albert_jax.checkpoint_restore import brief_error
from albert_jax.checkpoint_restore import check_shapes
from albert_jax.checkpoint_restore import checkpoint_dir
from albert_jax.checkpoint_restore import CHECKPOINTS
from albert_jax.checkpoint_restore import CheckpointShapeError
from albert_jax.checkpoint_restore import restore_latest
from albert_jax.checkpoint_restore import restore_params
from albert_jax.checkpoint_restore import to_numpy
from albert_jax.checkpoint_restore import UnreadableCheckpointError

# Reading back lives in albert_jax.checkpoint_restore; callers know its
# names as this module's.
__all__ = ["CHECKPOINTS", "CheckpointShapeError", "CheckpointWriteError",
           "UnreadableCheckpointError", "available_steps", "check_shapes",
           "checkpoint_dir", "manager", "restore_latest", "restore_params",
           "save", "to_numpy"]


class CheckpointWriteError(OSError):
  """Writing a checkpoint failed (disk full, quota, permissions...).

  The message names the failed step, what is still intact and what to do;
  `errno` is the underlying error's, when it had one.
  """


def _write_error(mngr: ocp.CheckpointManager, step: int | None,
                 error: BaseException) -> CheckpointWriteError:
  try:
    mngr.reload()
    intact = sorted(mngr.all_steps())
  except Exception:  # pylint: disable=broad-except
    intact = None  # the directory itself may be what failed
  what = f"checkpoint step {step}" if step is not None else "a checkpoint"
  reason = (error.strerror if isinstance(error, OSError) and error.strerror
            else f"{type(error).__name__}: {brief_error(error)}")
  if intact:
    kept = (f"The complete checkpoints (steps {intact}) are intact and the "
            "incomplete one is never restored: a rerun resumes from step "
            f"{intact[-1]}.")
  else:
    kept = "No complete checkpoint exists yet, so a rerun starts afresh."
  message = (f"Writing {what} to {mngr.directory} failed ({reason}). {kept} "
             "Free space on that disk (or lower config.keep_checkpoints, or "
             "choose another --workdir) and run again.")
  return CheckpointWriteError(getattr(error, "errno", None), message)


class _NoMetricsWarningFilter(logging.Filter):
  """Drops orbax's warning about a save without metrics.

  With a best metric tracked, orbax warns at every save given no metrics;
  the trainer saves between evaluations by design (those checkpoints are
  kept only while among the newest), so the warning says nothing.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    return "did not provide metrics" not in record.getMessage()


class _Manager(ocp.CheckpointManager):
  """A CheckpointManager whose failed writes raise CheckpointWriteError.

  An asynchronous write fails in a background thread and surfaces at the
  next `save` or `wait_until_finished`, as the bare error of whatever layer
  hit it; here it says which step failed and that the others are intact.
  """

  _writing: int | None = None  # the step of the last save started

  def save(self, step, *args, **kwargs):
    # orbax logs through absl, whose Python logger is "absl"; the filter is
    # there only for this call, so no other warning is lost.
    quiet = _NoMetricsWarningFilter()
    absl_logger = logging.getLogger("absl")
    absl_logger.addFilter(quiet)
    try:
      started = super().save(step, *args, **kwargs)
    except CheckpointWriteError:  # the previous write, from the wait
      raise
    except OSError as e:
      raise _write_error(self, int(step), e) from e
    finally:
      absl_logger.removeFilter(quiet)
    if started:
      self._writing = int(step)
    return started

  def wait_until_finished(self):
    try:
      super().wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      # Anything the background write raised means the write failed.
      raise _write_error(self, self._writing, e) from e


def manager(workdir: str, *, keep: int = 3, best_metric: str | None = None,
            best_mode: str = "max", async_save: bool = True
            ) -> ocp.CheckpointManager:
  """The workdir's checkpoint manager.

  Args:
    workdir: the run's directory; checkpoints go to `workdir/checkpoints`.
    keep: how many of the newest checkpoints to keep.
    best_metric: also keep the best checkpoint by this key of the metrics
      given to `save` (checkpoints saved without metrics are kept only while
      among the newest `keep`).
    best_mode: "max" or "min": which end of `best_metric` is best.
    async_save: write in a background thread while training continues.

  Returns:
    An orbax CheckpointManager; leftover `*.orbax-checkpoint-tmp` directories
    of an interrupted save are removed when it is created. A write that
    fails (e.g. a full disk) raises CheckpointWriteError from `save` or
    `wait_until_finished`, leaving the complete checkpoints intact.
  """
  if best_mode not in ("max", "min"):
    raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}.")
  directory = checkpoint_dir(workdir)
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise NotADirectoryError(
        f"{directory} is a file, where the workdir's checkpoints directory "
        "belongs; move it away, or choose another --workdir.")
  best_fn = (lambda m: m[best_metric]) if best_metric else None
  policies = [ocp.checkpoint_managers.LatestN(n=keep)]
  if best_metric:
    policies.append(ocp.checkpoint_managers.BestN(
        get_metric_fn=best_fn, reverse=best_mode == "min", n=1,
        keep_checkpoints_without_metrics=False))
  options = ocp.CheckpointManagerOptions(
      enable_async_checkpointing=async_save,
      preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(
          policies),
      # Without best_fn orbax writes no metrics to disk (a resumed run's
      # BestN then finds none and drops the best checkpoint) and
      # best_step() is simply the latest step.
      best_fn=best_fn, best_mode=best_mode,
      cleanup_tmp_directories=True)
  return _Manager(
      directory, options=options,
      item_handlers={"state": ocp.StandardCheckpointHandler(),
                     "meta": ocp.JsonCheckpointHandler()})


def save(mngr: ocp.CheckpointManager, state: Mapping[str, Any],
         meta: Mapping[str, Any], metrics: Mapping[str, float] | None = None,
         force: bool = False) -> bool:
  """Starts an (asynchronous) save of `state` at its step.

  Args:
    mngr: from `manager`.
    state: the train state; `state["step"]` names the checkpoint.
    meta: JSON-serialisable record saved beside it (data position, seed).
    metrics: eval metrics, for keeping the best checkpoint.
    force: save even if the manager's policy would skip this step.

  Returns:
    Whether a save was started.
  """
  step = int(jax.device_get(state["step"]))
  return mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(dict(state)),
      meta=ocp.args.JsonSave(dict(meta))),
                   metrics=dict(metrics) if metrics else None, force=force)
