"""The one training loop, shared by pre-training and fine-tuning.

`fit` steps a jitted train step over a stream of batches and does what every
run needs around it: metrics to TensorBoard and the progress bar, periodic
evaluation and checkpoints (the best kept by an eval metric), SIGTERM
(preemption) handling (a signal during an evaluation cuts it short), and the
non-finite guard: a step with a NaN/Inf loss or gradient is skipped by the
train step itself, and after `config.max_consecutive_nonfinite` skips in a
row the run stops with a message naming the step and the offending
parameters. It also accounts for the run's wall time (`goodput`: goodput,
badput by cause, slow steps, data stalls) and profiles the steps
`config.profile` names (`profiling`). The config's fields the loop reads
come in once as `LoopOptions` (`LoopOptions.from_config`); what differs
between pre-training and fine-tuning (data, model, eval) comes in as a
`FitPlan`; what comes before and after `fit` is `run_setup`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from typing import Any, Callable, Iterable

import jax

from albert_jax import storage
from albert_jax.model import flops as flops_lib
from albert_jax.training import checkpoints
from albert_jax.training import goodput as goodput_lib
from albert_jax.training import guards
from albert_jax.training import lease as lease_lib
from albert_jax.training import metrics as metrics_lib
from albert_jax.training import profiling

log = logging.getLogger(__name__)


@dataclasses.dataclass
class FitResult:
  state: Any
  last_eval: dict[str, float]
  preempted_at: int | None
  skipped_steps: int
  stopped_by: str | None = None  # the signal that stopped it early
  # `goodput.Account.summary` of the workdir's sessions, this one included.
  goodput: dict[str, Any] = dataclasses.field(default_factory=dict)


def _loader_hint(data) -> str:
  """The data-stall warning's first fix: the run's own loader settings
  (`config.data`)."""
  if data is None or "num_workers" not in data:
    return ""
  return (f"raise config.data.num_workers (now {data.num_workers}) or "
          f"config.data.prefetch (now {data.get('prefetch')}), ")


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """The run's settings `fit` follows, read once from its config.

  Attributes:
    num_train_steps: the step the run ends at (`config.num_train_steps`).
    log_every_steps, eval_every_steps, checkpoint_every_steps: the
      cadence of train metrics, evaluation and checkpoints (the config's
      fields of those names); the last step is always logged, evaluated
      and saved.
    max_consecutive_nonfinite: non-finite steps in a row that stop the run
      (`guards.NonFiniteGuard`).
    peak_tflops_per_device: for MFU; 0 looks the device kind up
      (`metrics.peak_tflops`).
    seed: `config.seed`, recorded in each checkpoint's metadata.
    goodput: `config.goodput`'s options (`goodput.GoodputOptions`).
    profile: `config.profile`'s options (`profiling.ProfileOptions`).
    loader_hint: the data-stall warning's first fix, naming the run's own
      `config.data` loader settings ("" where it has none).
  """
  num_train_steps: int
  log_every_steps: int
  eval_every_steps: int
  checkpoint_every_steps: int
  max_consecutive_nonfinite: int
  peak_tflops_per_device: float
  seed: int
  goodput: goodput_lib.GoodputOptions = goodput_lib.GoodputOptions()
  profile: profiling.ProfileOptions = profiling.ProfileOptions()
  loader_hint: str = ""

  @classmethod
  def from_config(cls, config) -> LoopOptions:
    """The options of a run's config (pre-training or fine-tuning).

    Reads: num_train_steps, log_every_steps, eval_every_steps,
    checkpoint_every_steps, max_consecutive_nonfinite,
    peak_tflops_per_device, seed, and the goodput, profile and data
    sections.
    """
    return cls(
        num_train_steps=config.num_train_steps,
        log_every_steps=config.log_every_steps,
        eval_every_steps=config.eval_every_steps,
        checkpoint_every_steps=config.checkpoint_every_steps,
        max_consecutive_nonfinite=config.max_consecutive_nonfinite,
        peak_tflops_per_device=config.peak_tflops_per_device,
        seed=config.seed,
        goodput=goodput_lib.GoodputOptions.from_config(config.goodput),
        profile=profiling.ProfileOptions.from_config(config.profile),
        loader_hint=_loader_hint(config.get("data")))


@dataclasses.dataclass(frozen=True)
class FitPlan:
  """What `fit` runs: a train step over batches, from where the run starts.

  Attributes:
    state: the train state at `start_step`.
    train_step: jitted (state, batch) → (state, metrics), as built by
      `step.make_train_step` + `step.jit_train_step`.
    batches: yields (step, global batch) from `start_step` on.
    start_step: the step `state` is at.
    resumed: the state came from a checkpoint at `start_step`.
    mngr: the workdir's checkpoint manager.
    workdir: where the checkpoints, metrics and goodput record go.
    evaluate: (state, step) → eval metrics, or None for no evaluation.
    flops_per_step: training FLOPs of one step, for MFU.
    rows_per_step: rows in a step's batch (`config.batch_size`, unless
      packed fine-tuning takes fewer rows of several examples each).
    tokens_per_sequence: for the tokens/s figure.
    param_paths: the parameters' `tree.flatten` keys, to name bad gradients.
    best_key: the eval metric that ranks checkpoints for best-retention
      (the manager's `best_metric`); None to rank none.
    lease: the workdir's lease; once another run has taken it over, the
      run stops before its next save (WorkdirBusyError).
    started_at: `time.time()` when the run started (None: now), so that
      goodput counts the start-up before `fit`.
  """
  state: Any
  train_step: Callable
  batches: Iterable
  start_step: int
  resumed: bool
  mngr: Any
  workdir: str
  evaluate: Callable[[Any, int], dict[str, float]] | None
  flops_per_step: float
  rows_per_step: int
  tokens_per_sequence: int
  param_paths: list[str]
  best_key: str | None = None
  lease: lease_lib.Lease | None = None
  started_at: float | None = None


def fit(options: LoopOptions, plan: FitPlan) -> FitResult:
  """Runs the plan's train step over its batches to
  `options.num_train_steps`.

  Args:
    options: the run's settings (`LoopOptions.from_config`): its last step,
      log/eval/checkpoint cadence, non-finite limit, peak TFLOP/s, seed,
      goodput and profile options.
    plan: the state, step, batches and the rest of what the run needs.

  Returns:
    The final state, the last eval, the preemption step (if any), the
    number of skipped (non-finite) steps and the goodput summary.
  """
  run = _Fit(options, plan)
  account = run.account
  with guards.Preemption() as preemption:
    run.preemption = preemption
    try:
      account.book("startup")
      for step, batch in plan.batches:
        account.data_waited()
        run.profiler.before(step + 1, run.state)
        done, m = run.train(step, batch)
        run.last_batch = batch
        stop, lost = preemption.agreed(plan.lease)
        if lost:
          raise lease_lib.WorkdirBusyError(
              f"The lease on {plan.workdir} was taken over by another run at "
              f"step {done}; this run stopped without saving, so as not to "
              "touch that run's checkpoints.")
        last = done == options.num_train_steps
        logged = done % options.log_every_steps == 0 or last
        if logged:
          run.log_train(done, m)
        account.step_done(done)
        if run.profiler.after(done, run.state, batch):
          account.book("profiling")
        if logged:
          run.log_goodput(done)
        if done % options.eval_every_steps == 0 and not last and not stop:
          stop = run.evaluate(done) or stop
        if done % options.checkpoint_every_steps == 0 and not last:
          run.save(done)
        if stop:
          log.warning("%s: saving step %d and stopping.", preemption.name,
                      done)
          run.shutdown(done)
          return run.result(preempted_at=done, stopped_by=preemption.name)
      # A signal now cuts the final evaluation short, or waits for the final
      # checkpoint.
      run.finish()
      run.close()
      if preemption.requested is not None:
        return run.result(preempted_at=options.num_train_steps,
                          stopped_by=preemption.name)
    except BaseException:
      run.abandon()
      raise
  return run.result()


class _Fit:
  """The phases of `fit`, around the state they share.

  `train` runs a step, `log_train` logs it, `evaluate` and `save` run at
  their cadence, `finish` evaluates and saves the last step, and `shutdown`
  saves a step and closes the run early (SIGTERM, too many non-finite
  steps). The guard reads each step's flags one step late (`check_pending`),
  so it never stalls the device queue: by then that step has finished.
  """

  def __init__(self, options: LoopOptions, plan: FitPlan):
    self.options, self.state, self.train_step = options, plan.state, (
        plan.train_step)
    self.mngr, self.workdir, self.evaluate_fn = plan.mngr, plan.workdir, (
        plan.evaluate)
    self.flops_per_step = plan.flops_per_step
    self.tokens_per_sequence = plan.tokens_per_sequence
    self.rows_per_step = plan.rows_per_step
    self.best_key = plan.best_key
    workdir, start_step = plan.workdir, plan.start_step
    is_main = jax.process_index() == 0
    self.writer = metrics_lib.Writer(
        os.fspath(storage.path(workdir) / "tensorboard"), enabled=is_main)
    self.progress = metrics_lib.Progress(options.num_train_steps,
                                         start_step,
                                         every=options.log_every_steps,
                                         enabled=is_main)
    self.peak = metrics_lib.peak_tflops(jax.devices()[0].device_kind,
                                        options.peak_tflops_per_device)
    self.guard = guards.NonFiniteGuard(
        options.max_consecutive_nonfinite, plan.param_paths)
    self.last_eval: dict[str, float] = {}
    self.last_eval_step = -1
    self.saved = {start_step} if plan.resumed else set()
    self.pending = None  # (step, metrics) of the previous step, for the guard
    self.t_last, self.s_last = time.time(), start_step
    self.account = goodput_lib.Account(
        workdir, options.goodput, start_step=start_step,
        started_at=plan.started_at, enabled=is_main)
    self.profiler = profiling.StepProfiler(
        options.profile, workdir, session_start=start_step,
        lower=getattr(plan.train_step, "lower", None))
    self.preemption: guards.Preemption | None = None  # set by `fit`
    self.last_batch = None
    self.closed = False

  def result(self, preempted_at: int | None = None,
             stopped_by: str | None = None) -> FitResult:
    return FitResult(self.state, self.last_eval, preempted_at,
                     self.guard.total, stopped_by, self.account.summary())

  def train(self, step: int, batch) -> tuple[int, Any]:
    """Runs step `step` (checking the one before): (steps done, metrics)."""
    self.state, m = self.train_step(self.state, batch)
    done = step + 1
    self.check_pending()
    self.pending = (done, m)
    return done, m

  def check_pending(self) -> None:
    """Hands the pending step's flags to the guard; when it gives up, saves
    the state and raises."""
    if self.pending is None:
      return
    step, m = self.pending
    self.pending = None
    if m is None:
      return
    flags = jax.device_get({"skipped": m["skipped"],
                            "nonfinite_grads": m["nonfinite_grads"],
                            "nonfinite_update": m.get("nonfinite_update")})
    try:
      self.guard.update(step, float(flags["skipped"]),
                        flags["nonfinite_grads"], flags["nonfinite_update"])
    except guards.NonFiniteError as e:
      # The state holds the last finite step's parameters (the step counter
      # may be one further: the next step was already queued), unless it
      # started non-finite (a damaged checkpoint): then nothing is saved.
      at = int(jax.device_get(self.state["step"]))
      if not guards.state_is_finite(self.state):
        self.shutdown(None)
        raise guards.NonFiniteError(
            f"{e} The parameters or optimizer state were already non-finite "
            "before these steps (a damaged checkpoint or init); nothing was "
            f"saved. Resume from an earlier checkpoint in {self.workdir}, or "
            "start a new run.") from None
      self.shutdown(at)
      raise guards.NonFiniteError(
          f"{e} The parameters of the last finite step were saved as "
          f"checkpoint {at} in {self.workdir}.") from None

  def log_train(self, done: int, m) -> None:
    """train/* scalars and the progress bar for the step just run."""
    self.check_pending()
    m = jax.device_get(m)
    m.pop("nonfinite_grads")
    m.pop("nonfinite_update", None)
    m = {k: float(v) for k, v in m.items()}
    now = time.time()
    dt = (now - self.t_last) / max(done - self.s_last, 1)
    self.t_last, self.s_last = now, done
    m["seq_per_sec"] = self.rows_per_step / dt
    if "examples" in m:  # a fine-tuning batch's real examples (packed rows
      m["examples_per_sec"] = m["examples"] / dt  # hold several each)
    m["tokens_per_sec"] = self.rows_per_step * self.tokens_per_sequence / dt
    # The objective's padding_fraction (from the batch): only real tokens
    # are useful work, so MFU counts their share of the step's FLOPs.
    real = 1.0 - m.get("padding_fraction", 0.0)
    m["real_tokens_per_sec"] = m["tokens_per_sec"] * real
    m["step_time"] = dt
    m["skipped_steps"] = float(self.guard.total)
    if self.peak:
      m["mfu"] = flops_lib.mfu(self.flops_per_step * real, dt,
                               self.peak * 1e12 * jax.device_count())
    self.writer.write(done, {f"train/{k}": v for k, v in m.items()})
    self.progress.update(done, m)

  def log_goodput(self, done: int) -> None:
    """goodput/* and badput/* scalars, the data-stall check, and (in a
    gs:// workdir, where goodput.json is not rewritten every step) the
    goodput record."""
    self.account.check_data_stall(self.options.loader_hint)
    self.writer.write(done, self.account.scalars())
    if self.account.remote:
      self.account.save()
    self.account.book("idle")

  def evaluate(self, step: int) -> bool:
    """Evaluates step `step`; whether a stop signal cut it short."""
    if self.evaluate_fn is None:
      return False
    try:
      with (self.preemption.interrupting() if self.preemption is not None
            else contextlib.nullcontext()):
        metrics = self.evaluate_fn(self.state, step)
    except guards.Interrupted as e:
      log.warning("%s during the evaluation of step %d: evaluation stopped "
                  "unfinished, to save at once.", e, step)
      self.account.book("evaluation")
      return True
    self.last_eval = metrics
    self.last_eval_step = step
    self.writer.write(step, {f"eval/{k}": v for k, v in self.last_eval.items()})
    self.account.book("evaluation")
    return False

  def save(self, step: int, force: bool = False) -> None:
    if step in self.saved:  # e.g. SIGTERM right after a periodic save
      return
    meta = {"step": step, "data_position": step, "seed": self.options.seed}
    # Only this step's own eval may rank it for "best" retention.
    metrics = None
    if (self.best_key and self.last_eval_step == step
        and self.best_key in self.last_eval):
      metrics = {self.best_key: self.last_eval[self.best_key]}
    checkpoints.save(self.mngr, self.state, meta, metrics=metrics,
                     force=force)
    self.saved.add(step)
    self.account.book("checkpoint")

  def finish(self) -> None:
    """The final evaluation and checkpoint."""
    self.check_pending()
    final_step = int(jax.device_get(self.state["step"]))
    if self.profiler.after(final_step, self.state, self.last_batch,
                           final=True):
      self.account.book("profiling")
    if self.last_eval_step != final_step:
      self.evaluate(final_step)
    self.save(final_step, force=True)
    self.mngr.wait_until_finished()
    self.account.book("checkpoint")

  def close(self) -> None:
    """Books the rest of the session and writes its goodput record."""
    if self.closed:
      return
    self.closed = True
    self.writer.close()
    self.account.book("idle")
    self.account.save()

  def abandon(self) -> None:
    """On an error: lets a checkpoint still being written (saves are
    asynchronous) finish before the error ends the process, so it is not
    left as a temporary directory that a resume skips."""
    try:
      self.mngr.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      log.warning("The checkpoint being written when the run failed could "
                  "not be finished: %s", e)
    self.profiler.abandon()
    self.account.book("checkpoint")
    try:
      self.close()
    except OSError as e:  # the error may be a full or unreachable workdir
      log.warning("The goodput record could not be written: %s", e)

  def shutdown(self, step: int | None) -> None:
    """Saves step `step` (None: nothing) and closes the run before its end."""
    self.profiler.abandon()
    if step is not None:
      self.save(step, force=True)
    self.mngr.wait_until_finished()
    self.account.book("checkpoint")
    self.close()
