"""What stops a run cleanly: preemption signals and the non-finite guard.

`Preemption` turns SIGTERM/SIGINT into a request the loop checks between
steps (all hosts agree before any stops); `NonFiniteGuard` counts the steps
the train step skipped for a NaN/Inf loss, gradient or update and stops the
run after `config.max_consecutive_nonfinite` in a row, naming the step and
the parameters.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from typing import Any

import jax
import numpy as np

log = logging.getLogger(__name__)


class NonFiniteError(FloatingPointError):
  """Too many consecutive steps had a NaN/Inf loss or gradient."""


class Interrupted(Exception):
  """A stop signal came during a phase `Preemption.interrupting` guards."""


class Preemption:
  """Turns SIGTERM and SIGINT (Ctrl-C) into a request the loop checks
  between steps: the step in progress finishes, is saved, and the run ends
  cleanly. A second Ctrl-C stops at once (KeyboardInterrupt), still keeping
  the newest finished checkpoint."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested: str | None = None  # the first signal's name
    self._previous = {}
    self._interruptible = False

  def __enter__(self):
    def handler(signum, frame):
      del frame
      if signum == signal.SIGINT and self.requested == "SIGINT":
        raise KeyboardInterrupt
      if self.requested is None:
        self.requested = signal.Signals(signum).name
        if signum == signal.SIGINT:
          sys.stderr.write("\nCtrl-C: saving after this step and stopping "
                           "(press Ctrl-C again to stop at once).\n")
        if self._interruptible:
          self._interruptible = False
          raise Interrupted(self.requested)
    for signum in self.SIGNALS:
      try:
        self._previous[signum] = signal.signal(signum, handler)
      except ValueError:  # not the main thread
        pass
    return self

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}

  @contextlib.contextmanager
  def interrupting(self):
    """A phase the first stop signal cuts short (evaluation): it raises
    `Interrupted` where the main thread is, so the run can save within
    seconds of a preemption notice rather than after the phase. Only in a
    single-process run: the hosts of a multi-host run would leave each other
    waiting in the phase's collectives, so there the phase finishes."""
    if jax.process_count() > 1 or not self._previous:
      yield
      return
    if self.requested is not None:
      raise Interrupted(self.requested)
    self._interruptible = True
    try:
      yield
    finally:
      self._interruptible = False

  @property
  def name(self) -> str:
    """The signal that stopped the run ("SIGTERM" when it came to another
    host)."""
    return self.requested or "SIGTERM"

  def agreed(self, lease=None) -> tuple[bool, bool]:
    """(stop, lease lost), agreed by all hosts: all stop together, or none
    does. Only process 0 holds the lease and sees it taken over."""
    flags = np.asarray([self.requested is not None,
                        lease is not None and lease.taken.is_set()])
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      flags = np.any(multihost_utils.process_allgather(flags), axis=0)
    return bool(flags[0]), bool(flags[1])


def state_is_finite(state: Any) -> bool:
  """Whether every float array of the train state is finite."""
  from albert_jax.training import step as step_lib  # pylint: disable=g-import-not-at-top
  bad = jax.jit(step_lib.nonfinite_leaves)(
      {k: state[k] for k in ("params", "opt_state") if k in state})
  return not bool(np.any(jax.device_get(bad)))


class NonFiniteGuard:
  """Counts consecutive skipped steps; raises after `limit` of them."""

  def __init__(self, limit: int, param_paths: list[str]):
    if limit < 1:
      raise ValueError(f"config.max_consecutive_nonfinite must be >= 1, got "
                       f"{limit}.")
    self.limit, self.paths = limit, param_paths
    self.streak = 0
    self.total = 0

  def update(self, step: int, skipped: float, bad_leaves: np.ndarray,
             bad_update: np.ndarray | None = None) -> None:
    """Records step `step`'s outcome (1-based: the step that just ran).
    `bad_update` flags the parameters (and, last, the optimizer state) the
    update would have made non-finite."""
    if not skipped:
      self.streak = 0
      return
    self.streak += 1
    self.total += 1
    bad = [p for p, b in zip(self.paths, np.asarray(bad_leaves)) if b]
    if not bad and bad_update is not None and np.any(bad_update):
      flags = np.asarray(bad_update)
      bad = [f"{p} (its update)" for p, b in zip(self.paths, flags) if b]
      bad += ["the optimizer state"] if flags[-1] else []
    log.warning("Step %d: non-finite loss, gradient or update, update "
                "skipped (%d in a row). Non-finite: %s", step, self.streak,
                ", ".join(bad) or "none (the loss itself)")
    if self.streak >= self.limit:
      shown = ", ".join(bad[:20]) + (" …" if len(bad) > 20 else "")
      raise NonFiniteError(
          f"Stopped at step {step}: the last {self.streak} steps all had a "
          f"non-finite loss, gradient or update. Non-finite at step {step}: "
          f"{shown or 'none (the loss itself)'}. "
          "Lower optimizer.learning_rate, check the data at these steps, "
          "use float32 (model.dtype), or raise "
          "config.max_consecutive_nonfinite.")
