"""What every run does before and after `loop.fit`, written once.

Pre-training (`pretrain.run`) and fine-tuning (`finetune.run.run`) go
through the same stages, in this order:

  check      the config (`config_check`), the profile it asks for, the
             workdir (no links out of it, its recipe: `recipe.check`) and
             anything the caller adds (fine-tuning's data files), before
             anything is written;
  workdir    created, failing early if it is not writable;
  lease      taken (`lease.acquire`), unless the caller holds it;
  mesh       and logical-axis rules, checked against the batch size before
             any data work;
  restore    the newest checkpoint, else a fresh sharded state;
  record     the config, recipe and git commit beside the checkpoints;
  fit        `loop.fit` from the start state;
  final      metrics written to `final_metrics.json`.

`start` does the first four and yields a `Run`, whose methods do the rest.
What differs between the runs (data, model, evaluation) stays with them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import time
from typing import (Any, Callable, Iterable, Iterator, Mapping, Protocol,
                    Sequence)

import jax

from albert_jax import sharding as sharding_lib
from albert_jax import storage
from albert_jax import tree as tree_lib
from albert_jax.training import checkpoints
from albert_jax.training import config_check
from albert_jax.training import defaults
from albert_jax.training import lease as lease_lib
from albert_jax.training import loop
from albert_jax.training import profiling
from albert_jax.training import recipe
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib

log = logging.getLogger(__name__)


# XLA:CPU spends most of a small model's compile time in LLVM and the fusion
# emitters; without them compiles are several times faster and steps slower.
FAST_COMPILE_OPTIONS = {"xla_backend_optimization_level": 0,
                        "xla_cpu_use_fusion_emitters": False,
                        "xla_llvm_disable_expensive_passes": True}


def compiler_options(config) -> dict[str, Any] | None:
  """`jax.jit` compiler options for `config.fast_compile` (smoke runs and
  debugging on CPU: quicker to start, slower per step), else None."""
  if config.fast_compile and jax.default_backend() == "cpu":
    return dict(FAST_COMPILE_OPTIONS)
  return None


def mesh_and_rules(config):
  """The run's mesh and sharding rules, checked against the batch size.

  Called before any data work, so a mesh or batch that cannot work fails in
  seconds rather than after tokenizer training and data preparation.
  """
  mesh, rules = sharding_lib.mesh_and_rules(config.mesh,
                                            config.sharding_rules)
  dp = sharding_lib.data_parallel_size(mesh)
  if config.batch_size % (dp * config.accumulation_steps):
    raise ValueError(
        f"batch_size {config.batch_size} must be divisible by the "
        f"data-parallel size ({dp}) × accumulation_steps "
        f"({config.accumulation_steps}); change --config.batch_size or "
        "--config.mesh.")
  return mesh, rules


def git_commit() -> str:
  try:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=os.path.dirname(__file__),
        capture_output=True, text=True, check=True, timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def prepare_workdir(workdir: str) -> None:
  """Creates the workdir, failing early and clearly if it is not writable."""
  try:
    root = storage.path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    probe = root / f".write_test.{os.getpid()}"
    probe.write_text("ok")
    probe.unlink()
  except OSError as e:
    raise PermissionError(
        f"Cannot write to workdir {workdir} ({e.strerror or e}); choose a "
        "directory you can write, e.g. --workdir=/tmp/albert_run or "
        "gs://BUCKET/albert_run.") from e


def record_config(config, workdir: str,
                  rows_per_step: int | None = None) -> None:
  """Writes the resolved config, its recipe (`recipe.record`, with a packed
  pre-training run's `rows_per_step`) and the git commit beside the
  checkpoints.

  Called once the state is known to fit the config, so a rerun with another
  config cannot leave a config.json that does not describe the checkpoints.
  """
  recipe.record(config, workdir, rows_per_step)
  if jax.process_index() == 0:
    root = storage.path(workdir)
    storage.write_atomic(root / "config.json",
                         config.to_json_best_effort(indent=2))
    storage.write_atomic(root / "git_commit.txt", git_commit() + "\n")


@contextlib.contextmanager
def leased(config, workdir: str) -> Iterator[lease_lib.Lease]:
  """`workdir`'s lease, held while the block runs (taken over from a live
  run only with `config.take_over_workdir`)."""
  with lease_lib.acquire(workdir,
                         config.take_over_workdir) as lease:
    yield lease


@dataclasses.dataclass
class StartState:
  """Where a run starts: its state, shardings, checkpoint manager."""
  state: Any
  shardings: Any
  abstract: Any  # unboxed ShapeDtypeStructs of the state
  mngr: Any
  resumed: bool

  @property
  def step(self) -> int:
    return int(jax.device_get(self.state["step"]))


def restore_or_create(config, workdir: str, init: Callable, tx, mesh, rules,
                      *, best_metric: str | None,
                      on_create: Callable | None = None) -> StartState:
  """The workdir's newest readable checkpoint, else a fresh sharded state.

  Args:
    init: rng → boxed state (`state.state_init_fn`).
    best_metric: the eval metric the manager keeps the best checkpoint by.
    on_create: (state, shardings) → state, applied to a fresh state only
      (fine-tuning places the pre-trained weights there).
  """
  rng = jax.random.key(config.seed)
  abstract, shardings = state_lib.abstract_state(init, tx, mesh, rules, rng)
  mngr = checkpoints.manager(workdir, keep=config.keep_checkpoints,
                             best_metric=best_metric,
                             async_save=config.async_checkpoints)
  restored = checkpoints.restore_latest(mngr, abstract, shardings)
  if restored is not None:
    state = restored[0]
    log.info("Resumed from step %d in %s.", int(state["step"]), workdir)
  else:
    state, _ = state_lib.create_state(init, tx, mesh, rules, rng,
                                      compiler_options(config))
    if on_create is not None:
      state = on_create(state, shardings)
  return StartState(state, shardings, abstract, mngr, restored is not None)


class StepBatches(Protocol):
  """Training batches as a pure function of the step (so a resumed run sees
  the batches an uninterrupted one would): the pre-training `Loader` and
  fine-tuning's `ArrayBatches`."""

  def iterate(self, start_step: int, num_steps: int
              ) -> Iterable[tuple[int, Any]]:
    """(step, global batch) for steps start_step … start_step+num_steps−1."""


@dataclasses.dataclass(frozen=True)
class Run:
  """A run past its checks: its workdir, held lease, mesh and rules."""
  config: Any
  workdir: str
  lease: lease_lib.Lease
  mesh: jax.sharding.Mesh
  rules: Any
  started_at: float  # `time.time()` at the start; goodput counts from here

  @property
  def data_sharding(self) -> jax.sharding.NamedSharding:
    """[batch, ...] arrays split over the data-parallel axes."""
    return sharding_lib.data_sharding(self.mesh)

  @property
  def compiler_options(self) -> dict[str, Any] | None:
    return compiler_options(self.config)

  def restore_or_create(self, init: Callable, tx, *,
                        best_metric: str | None,
                        on_create: Callable | None = None) -> StartState:
    """`restore_or_create` in this run's workdir, mesh and rules."""
    return restore_or_create(self.config, self.workdir, init, tx, self.mesh,
                             self.rules, best_metric=best_metric,
                             on_create=on_create)

  def record_config(self, rows_per_step: int | None = None) -> None:
    record_config(self.config, self.workdir, rows_per_step)

  def jit_train_step(self, objective, tx, schedule, shardings) -> Callable:
    """The objective's train step (`step.make_train_step`), jitted onto the
    state's `shardings` in this run's mesh."""
    return step_lib.jit_train_step(
        step_lib.make_train_step(objective, tx, schedule,
                                 self.config.accumulation_steps),
        shardings, self.mesh, self.rules, self.compiler_options)

  def fit(self, start: StartState, train_step: Callable,
          batches: StepBatches, *,
          evaluate: Callable[[Any, int], dict[str, float]] | None,
          flops_per_step: float, tokens_per_sequence: int,
          best_key: str | None, rows_per_step: int | None = None
          ) -> loop.FitResult:
    """`loop.fit` from `start` to `config.num_train_steps`, by the
    config's `loop.LoopOptions`; a step's batch holds `rows_per_step` rows
    (None: `config.batch_size`)."""
    config, step = self.config, start.step
    return loop.fit(loop.LoopOptions.from_config(config), loop.FitPlan(
        state=start.state, train_step=train_step, mngr=start.mngr,
        workdir=self.workdir, batches=batches.iterate(
            step, max(config.num_train_steps - step, 0)),
        start_step=step, resumed=start.resumed, evaluate=evaluate,
        flops_per_step=flops_per_step,
        rows_per_step=rows_per_step or config.batch_size,
        tokens_per_sequence=tokens_per_sequence,
        param_paths=list(tree_lib.flatten(start.state["params"])),
        best_key=best_key, lease=self.lease, started_at=self.started_at))

  def write_final_metrics(self, result: dict[str, Any]) -> None:
    """`result` as the workdir's final_metrics.json (by process 0)."""
    if jax.process_index() == 0:
      storage.write_atomic(storage.path(self.workdir) / "final_metrics.json",
                           json.dumps(result, indent=2))


def stopped_early(out: loop.FitResult) -> dict[str, Any]:
  """What a run that a signal stopped before its last step returns."""
  return {"preempted_at": out.preempted_at, "stopped_by": out.stopped_by,
          "goodput": out.goodput}


@contextlib.contextmanager
def start(config, workdir: str, *, lease: lease_lib.Lease | None = None,
          check: Callable[[Any, str], None] | None = None,
          choices: Mapping[str, Sequence[str]] | None = None
          ) -> Iterator[Run]:
  """Checks `config`, prepares and leases `workdir`, and makes the mesh.

  Args:
    config: the run's config; the fields an earlier version's config lacks
      are added to it (`defaults.fill`).
    workdir: a local path or gs://BUCKET/PATH.
    lease: the workdir's, when the caller already holds it (else taken
      here and released when the block ends).
    check: (config, workdir) → None, the caller's own checks (fine-tuning's
      data files), run after the workdir's links and before its recipe.
    choices: the allowed values of config fields whose owners are above
      this stage (fine-tuning's `registry.config_choices()`), for
      `config_check.check`.

  Yields:
    The `Run`, its lease held.
  """
  started_at = time.time()  # goodput counts the start-up from here
  defaults.fill(config)  # the fields an earlier version's config lacks
  config_check.check(config, choices=choices)
  profiling.check_can_trace(
      profiling.ProfileOptions.from_config(config.profile))
  workdir = storage.as_str(workdir)
  storage.refuse_links_out(workdir)
  if check is not None:
    check(config, workdir)
  recipe.check(config, workdir)
  prepare_workdir(workdir)
  with (contextlib.nullcontext(lease) if lease is not None
        else leased(config, workdir)) as held:
    mesh, rules = mesh_and_rules(config)
    yield Run(config, workdir, held, mesh, rules, started_at)
