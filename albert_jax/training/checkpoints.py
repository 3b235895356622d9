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

Reading back: `restore_latest` resumes training from the newest readable
checkpoint, falling back to older ones (with a warning) when the newest is
corrupt or incomplete; `restore_params` reads only the parameters, onto one
device, for inference and fine-tuning. Both first compare the checkpoint's
stored shapes with the model's and raise
`checkpoint_shapes.CheckpointShapeError` listing every mismatched array.
"""

from __future__ import annotations

import errno as errno_lib
import logging
import os
import re
import shutil
import sys
import warnings
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp

from albert_jax import retry
from albert_jax import storage
from albert_jax.training import checkpoint_shapes as shapes_lib

log = logging.getLogger(__name__)

storage.raise_tensorstore_retries()


class CheckpointWriteError(OSError):
  """Writing a checkpoint failed (disk full, quota, permissions...).

  The message names the failed step, what is still intact and what to do;
  `errno` is the underlying error's, when it had one.
  """

  def __str__(self) -> str:
    return self.strerror or super().__str__()  # not "[Errno 28] Writing…"


def _write_error(mngr: ocp.CheckpointManager, step: int | None,
                 error: BaseException) -> CheckpointWriteError:
  try:
    mngr.reload()
    intact = sorted(mngr.all_steps())
  except Exception:  # pylint: disable=broad-except
    intact = None  # the directory itself may be what failed
  what = f"checkpoint step {step}" if step is not None else "a checkpoint"
  code, reason = _os_failure(error)
  if reason is None:
    reason = f"{type(error).__name__}: {brief_error(error)}"
  if intact:
    kept = (f"The complete checkpoints (steps {intact}) are intact and the "
            "incomplete one is never restored: a rerun resumes from step "
            f"{intact[-1]}.")
  else:
    kept = "No complete checkpoint exists yet, so a rerun starts afresh."
  fix = (" Free space on that disk (or lower config.keep_checkpoints, or "
         "choose another --workdir) and run again.")
  outage = _cause(error, retry.StorageUnavailableError)
  if outage is not None:  # its text says what to do
    reason, fix = str(outage), ""
  message = (f"Writing {what} to {mngr.directory} failed ({reason}). "
             f"{kept}{fix}")
  if code is None:  # not "[Errno None] Writing …"
    return CheckpointWriteError(message)
  return CheckpointWriteError(code, message)


# Tensorstore (orbax's array writes) reports a failed system call in its
# status text: `Failed writing: "PATH": Failed to write N bytes to file 17:
# No space left on device [os_error_code='28']`.
_TS_OS_ERROR = re.compile(r"\[os_error_code='(\d+)'\]")
_TS_PATH = re.compile(r'(?:Failed writing: |local file )"([^"]+)"')


def _os_failure(error: BaseException) -> tuple[int | None, str | None]:
  """(errno, reason) of the system call that failed in `error`'s chain: an
  OSError's, or one tensorstore reports in its text ("File too large,
  writing PATH"); (None, None) if no system call failed."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.strerror:
      return error.errno, error.strerror
    code = _TS_OS_ERROR.search(str(error))
    if code:
      code = int(code.group(1))
      paths = _TS_PATH.findall(str(error))
      where = f", writing {paths[-1]}" if paths else ""
      return code, f"{os.strerror(code)}{where}"
    error = error.__cause__ or error.__context__
  return None, None


# Orbax's files beside the arrays (tree structure, shardings, JSON): tens
# of KiB for the models here; a margin, not a measurement.
_METADATA_BYTES = 4 * 2**20


def _check_space(mngr: ocp.CheckpointManager, step: int,
                 state: Mapping[str, Any]) -> None:
  """Refuses a save that a local disk has no room for, before a byte is
  written.

  On a full disk orbax's writes fail in background threads and leave a
  partial directory; a checkpoint's size is known beforehand (its arrays,
  plus small metadata), so the common case fails here instead. A disk
  that fills during the write still fails there, as CheckpointWriteError
  too. Cloud Storage has no free space to ask.

  Raises:
    CheckpointWriteError: ENOSPC, with the sizes and what is intact.
  """
  directory = os.fspath(mngr.directory)
  if storage.is_remote(directory):
    return
  try:
    free = shutil.disk_usage(directory).free
  except OSError:
    return  # the write itself will say what is wrong
  need = _METADATA_BYTES + sum(
      int(getattr(x, "nbytes", 0)) for x in jax.tree_util.tree_leaves(state))
  if free < need:
    raise _write_error(mngr, step, OSError(
        errno_lib.ENOSPC, f"it needs about {need / 2**20:.1f} MiB and the "
        f"disk has {free / 2**20:.1f} MiB free"))


def hide_failed_write_reports() -> None:
  """Keeps the reports of a failed background write off the console.

  When an asynchronous save fails (a disk that fills during the write),
  orbax's threads log the error with a traceback once per thread, asyncio
  reports each of orbax's tasks whose error nobody retrieved, and
  tensorstore's callbacks into the closed event loop print one more
  traceback each: 30 tracebacks and 500 lines for one failure, which the
  CheckpointWriteError that `save` or `wait_until_finished` raises names
  in one line. This drops those reports only: errors logged with an
  exception raised through orbax's code, and "Event loop is closed" raised
  in a callback nobody can catch. The command line calls it unless
  --traceback.
  """
  orbax_dir = os.path.dirname(ocp.__file__)

  def through_orbax(record: logging.LogRecord) -> bool:
    tb = record.exc_info[1].__traceback__ if record.exc_info else None
    while tb is not None:
      if tb.tb_frame.f_code.co_filename.startswith(orbax_dir):
        return True
      tb = tb.tb_next
    return False

  def in_a_checkpoint_write(record: logging.LogRecord) -> bool:
    # tensorstore's failed writes reach asyncio as futures nobody retrieved,
    # their exceptions raised in C++ (no traceback through orbax), naming
    # the checkpoint's temporary directory.
    exc = record.exc_info[1] if record.exc_info else None
    return exc is not None and ".orbax-checkpoint-tmp" in str(exc)

  class _OrbaxFailures(logging.Filter):

    def filter(self, record: logging.LogRecord) -> bool:
      return record.levelno < logging.ERROR or not (
          through_orbax(record) or in_a_checkpoint_write(record))

  # orbax logs through absl (Python logger "absl"); asyncio's "Task
  # exception was never retrieved" through "asyncio".
  for name in ("absl", "asyncio"):
    logger = logging.getLogger(name)
    if not any(isinstance(f, _OrbaxFailures) for f in logger.filters):
      logger.addFilter(_OrbaxFailures())

  # Garbage-collected at exit, orbax's abandoned write coroutines warn too.
  warnings.filterwarnings(
      "ignore", message=r"coroutine 'async_serialize\S*' was never awaited",
      category=RuntimeWarning)

  previous = sys.unraisablehook

  def unraisable(info):
    if (isinstance(info.exc_value, RuntimeError)
        and str(info.exc_value) == "Event loop is closed"):
      return
    previous(info)

  sys.unraisablehook = unraisable


def _cause(error: BaseException, kind: type) -> BaseException | None:
  """`error`, or the first error of class `kind` in its chain of causes."""
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, kind):
      return error
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return None


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
  if storage.path(directory).exists() and not storage.path(directory).is_dir():
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
  latest = mngr.latest_step()
  if latest is None or step > latest:  # else orbax skips it
    _check_space(mngr, step, state)
  return mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(dict(state)),
      meta=ocp.args.JsonSave(dict(meta))),
                   metrics=dict(metrics) if metrics else None, force=force)


################################################################################
# Reading back.
################################################################################


CHECKPOINTS = "checkpoints"  # the subdirectory of a workdir


def checkpoint_dir(workdir: str) -> str:
  """Where a workdir's checkpoints live."""
  return os.fspath(storage.path(storage.as_str(workdir)) / CHECKPOINTS)


class UnreadableCheckpointError(RuntimeError):
  """Checkpoints exist, but none of them can be read."""


def _abstract(tree, shardings):
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree, shardings)


def brief_error(error: BaseException, limit: int = 400) -> str:
  """An error's text cut short: tensorstore's embed kilobytes of spec."""
  text = " ".join(str(error).split())
  text = re.sub(r" ?\[tensorstore_spec=.*", "", text)
  return text if len(text) <= limit else text[:limit] + " …"


def _read_metadata(mngr, step, directory):
  """Stored shapes, or None (with a warning) when the metadata is unreadable."""
  try:
    return shapes_lib.stored_shapes(mngr, step)
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
  if jax.process_index() == 0:
    root = storage.path(os.fspath(mngr.directory))
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
  wanted = shapes_lib.target_shapes(target)
  steps = sorted(mngr.all_steps(), reverse=True)
  failures = []
  for step in steps:
    stored = _read_metadata(mngr, step, mngr.directory)
    if stored is None:
      failures.append(step)
      continue
    problems = shapes_lib.shape_problems(stored, wanted)
    if problems:
      raise shapes_lib.shape_error(mngr.directory, step, problems)
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
  if not storage.path(directory).is_dir():
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
  mngr = (_read_only_manager(directory) if storage.path(directory).is_dir()
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
  wanted = shapes_lib.target_shapes(target)
  failures = []
  for s in steps:
    stored = _read_metadata(mngr, s, directory)
    if stored is None:
      failures.append(s)
      continue
    problems = shapes_lib.shape_problems(stored, wanted,
                                         extra_under=["params"])
    if problems:
      raise shapes_lib.shape_error(directory, s, problems)
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
