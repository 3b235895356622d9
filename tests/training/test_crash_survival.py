"""Training survives SIGKILL at any moment and ends bitwise where it should.

One tiny run (`python -m albert_jax.main`, configs/tiny.py with dropout, 20
steps, an asynchronous checkpoint every 2 steps, the newest 3 kept) goes
uninterrupted: the reference. A second run in another workdir is SIGKILLed
8 times (KINDS), each time relaunched on the same workdir, then allowed to
finish. Kill moments are drawn from a seeded generator (CRASH_TEST_SEED in
the environment replays another draw; failures print the seed and every
launch's plan and report) and come in three kinds, carried out by
tests/training/crash_worker.py:

  time     a random time into the launch: imports, restore, tracing, or
           training, wherever it happens to be;
  step     a random instant just after a random step begins;
  write    while a random checkpoint is half-written by orbax's background
           thread (a random number of its files on disk; a write that wins
           the race with the poll is killed just after it).

Once, between two launches, the newest complete checkpoint is corrupted
(its array files truncated), as a disk fault would.

Checked after every launch: it restored exactly the newest complete
checkpoint on disk (never a half-written `*.orbax-checkpoint-tmp`, never
the corrupted one, which is reported with a warning and set aside); and at
the end: the interrupted run's checkpoints, the final one included, hold
the reference's whole train state (parameters, optimizer state, step, RNG)
bit for bit, with no temporary directory left behind.

Every launch after the reference's first checkpoint loads the compiled
steps from a persistent compilation cache, and XLA's backend optimisations
are off (XLA_FLAGS and --config.fast_compile, as in test_resume), which
keeps the 10 launches within budget.
"""

import glob
import gzip
import itertools
import json
import os
import pathlib
import re
import resource
import signal
import subprocess
import sys
import time
import warnings

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest

from albert_jax.data import pipeline
from albert_jax.text import run_tokenizer
from albert_jax.text import train_tokenizer as text_train
from albert_jax.training import defaults
from locations import CORPUS
from locations import REPO

# Whole runs: the long tier (tests/conftest.py).
pytestmark = pytest.mark.long

# The worker beside this file runs the CLI with a planned kill.
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "crash_worker.py")
VOCAB, SEQ, STEPS, EVERY, KEEP = 300, 32, 20, 2, 3
SEED = int(os.environ.get("CRASH_TEST_SEED", "7"))
# Three kinds of moment, each its own code path: a random time (imports,
# restore, tracing or training), mid-step, mid-write. Two of each of the
# first two (every step and write kill gets past the restore, so those
# alone make the 6 restores checked below), four writes (at least two must
# land with the temporary directory still there).
KINDS = ("time",) * 2 + ("step",) * 2 + ("write",) * 4
TIMEOUT = 300


@pytest.fixture(name="dataset", scope="module")
def fixture_dataset(tiny_sop_dataset):
  """conftest's 300-piece tokenizer and ≈200 SOP instances of length 32."""
  tokenizer, data_dir = tiny_sop_dataset
  with open(os.path.join(data_dir, "dataset.json"), encoding="utf-8") as f:
    meta = json.load(f)
  assert (meta["vocab_size"], meta["max_seq_length"]) == (VOCAB, SEQ)
  assert meta["splits"]["train"]["instances"] >= STEPS * 8
  return tokenizer, data_dir


class Launch:
  """One worker process; its output goes to a file so nothing blocks."""

  def __init__(self, name, workdir, dataset, root, plan=""):
    tokenizer, data_dir = dataset
    self.name, self.plan, self.workdir = name, plan, str(workdir)
    self.log = root / f"{name}.log"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "CRASH_PLAN": plan,
           "JAX_COMPILATION_CACHE_DIR": str(root / "jax_cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
           # Compile time dominates a tiny model; every launch runs the same
           # flags, so the executables (and the bits) are the same.
           "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    command = [
        sys.executable, WORKER, "--config=configs/tiny.py:dropout=0.1",
        f"--workdir={workdir}", f"--config.data.tokenizer={tokenizer}",
        f"--config.data.data_dir={data_dir}",
        f"--config.model.vocab_size={VOCAB}",
        f"--config.model.max_position_embeddings={SEQ}",
        f"--config.data.max_seq_length={SEQ}",
        "--config.masking.max_predictions=5", "--config.batch_size=8",
        f"--config.num_train_steps={STEPS}",
        "--config.optimizer.warmup_steps=2",
        f"--config.checkpoint_every_steps={EVERY}",
        f"--config.keep_checkpoints={KEEP}", "--config.async_checkpoints=true",
        "--config.log_every_steps=5", "--config.eval_batches=0",
        "--config.fast_compile=true"]
    self._file = open(self.log, "w", encoding="utf-8")
    self.start = time.time()
    self.proc = subprocess.Popen(command, cwd=REPO, env=env,
                                 stdout=self._file, stderr=subprocess.STDOUT)
    self.seconds = None

  def wait(self, timeout=TIMEOUT):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
      self.proc.wait(timeout=timeout)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()
        self.proc.wait()
      self._file.close()
      self.seconds = time.time() - self.start
      after = resource.getrusage(resource.RUSAGE_CHILDREN)
      # Only this process is reaped meanwhile (the launches are sequential
      # and the reference is reaped last).
      self.cpu = (after.ru_utime + after.ru_stime - before.ru_utime
                  - before.ru_stime)
    return self.proc.returncode

  @property
  def output(self):
    return self.log.read_text(encoding="utf-8")

  def reports(self):
    """The worker's "CRASH:" lines, without their timestamps."""
    return [re.sub(r" at [0-9.]+s$", "", line[len("CRASH: "):])
            for line in self.output.splitlines() if line.startswith("CRASH:")]

  def restored(self):
    """The step restored at start-up: an int, "none", or None if the
    launch died before restoring."""
    for line in self.reports():
      if line.startswith("restored "):
        value = line.split()[1]
        return value if value == "none" else int(value)
    return None

  def first_step_seconds(self):
    for line in self.output.splitlines():
      m = re.match(r"CRASH: first step \d+ at ([0-9.]+)s$", line)
      if m:
        return float(m.group(1))
    return None

  def describe(self):
    return (f"--- {self.name} [{self.plan or 'no kill'}] rc "
            f"{self.proc.returncode}: {self.reports()}")


def complete_steps(workdir):
  """Checkpoints renamed into place (orbax's sign of a finished write)."""
  root = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(root):
    return []
  return sorted(int(n) for n in os.listdir(root) if n.isdigit())


def corrupt(workdir, step):
  """Truncates every array file of a checkpoint to half its size."""
  files = glob.glob(os.path.join(workdir, "checkpoints", str(step), "state",
                                 "**", "d", "*"), recursive=True)
  assert files, f"checkpoint {step} has no array files to corrupt"
  for path in files:
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)


def draw_plan(rng, kind, start, launch_seconds):
  """A CRASH_PLAN for a launch that resumes from state step `start`.

  Targets stay a few steps ahead of `start` and short of the end, so every
  launch is killed before it can finish; a "time" kill comes within
  `launch_seconds`, about when the previous launch began training.
  """
  if kind == "step" and start < STEPS - 2:
    target = min(start + int(rng.integers(0, 6)), STEPS - 2)
    return f"step:{target}:{rng.random():.3f}"
  if kind == "write" and start + EVERY <= STEPS - EVERY:
    target = min(start + EVERY * int(rng.integers(1, 4)), STEPS - EVERY)
    return f"write:{target}:{rng.random():.3f}"
  return f"time:{rng.random() * launch_seconds:.3f}"


def _state(workdir, step):
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Sharding info not provided")
    return jax.tree.map(np.asarray, ocp.PyTreeCheckpointer().restore(path))


@pytest.fixture(scope="module")
def chain(dataset, tmp_path_factory):
  root = tmp_path_factory.mktemp("crash")
  reference_dir, workdir = root / "reference", root / "killed"
  rng = np.random.default_rng(SEED)
  kinds = [str(k) for k in rng.permutation(KINDS)]
  corrupt_from = int(rng.integers(3, 7))
  history = [f"CRASH_TEST_SEED={SEED}: kinds {kinds}, corrupt from launch "
             f"{corrupt_from}"]
  launches, checks = [], []
  corrupted = None  # a corrupted step not yet set aside

  def fail(message):
    pytest.fail("\n".join([message] + history))

  try:
    reference = Launch("reference", reference_dir, dataset, root)
    launches.append(reference)
    # Once the reference has written a checkpoint, the compilation cache
    # holds its init and train steps: the killed run starts then.
    deadline = time.time() + TIMEOUT
    while not complete_steps(reference_dir):
      if reference.proc.poll() is not None or time.time() > deadline:
        reference.wait(1)
        fail(f"reference wrote no checkpoint:\n{reference.output[-4000:]}")
      time.sleep(0.05)
    launch_seconds = 3.0
    for i, kind in enumerate(kinds + ["finish"]):
      on_disk = complete_steps(workdir)
      if (corrupted is None and not any("corrupted" in c for c in checks)
          and i >= corrupt_from and len(on_disk) >= 2):
        corrupted = on_disk[-1]
        corrupt(workdir, corrupted)
        checks.append(f"corrupted checkpoint {corrupted}")
        history.append(f"corrupted checkpoint {corrupted}")
      usable = [s for s in on_disk if s != corrupted]
      expected = usable[-1] if usable else "none"
      plan = ("" if kind == "finish" else draw_plan(
          rng, kind, usable[-1] if usable else 0, launch_seconds))
      launch = Launch(f"launch{i}", workdir, dataset, root, plan)
      launches.append(launch)
      rc = launch.wait()
      left = sorted(os.listdir(os.path.join(workdir, "checkpoints"))) if (
          os.path.isdir(os.path.join(workdir, "checkpoints"))) else []
      history.append(f"{launch.describe()}; expected restore {expected}; "
                     f"left {left}")
      want_rc = 0 if kind == "finish" else -signal.SIGKILL
      if rc != want_rc:
        fail(f"launch {i} exited {rc}, not {want_rc}:\n"
             f"{launch.output[-4000:]}")
      restored = launch.restored()
      if kind == "finish" and restored is None:
        fail("the last launch reported no restore")
      if restored is not None and restored != expected:
        fail(f"launch {i} restored {restored}; the newest complete, intact "
             f"checkpoint was {expected}")
      warned = "trying the previous one" in launch.output
      set_aside = corrupted is not None and os.path.isdir(os.path.join(
          workdir, "checkpoints", f"{corrupted}.unreadable"))
      # A launch killed while it falls back (after the warning, before the
      # restore is reported) may or may not have set the corrupted
      # checkpoint aside yet: if not, the next launch meets it again.
      if corrupted is not None and (restored is not None or set_aside):
        if not warned or f"step {corrupted}" not in launch.output:
          fail(f"launch {i} skipped corrupted checkpoint {corrupted} "
               "without the warning")
        if not set_aside:
          fail(f"corrupted checkpoint {corrupted} was not set aside")
        checks.append(f"skipped corrupted {corrupted}, warned")
        corrupted = None
      elif warned and corrupted is None:
        fail(f"launch {i} found an unreadable checkpoint it should not have")
      for line in launch.reports():
        m = re.match(r"SIGKILL during the write of checkpoint (\d+)", line)
        if m:
          step = int(m.group(1))
          if glob.glob(os.path.join(workdir, "checkpoints",
                                    f"{step}.orbax-checkpoint-tmp*")):
            checks.append(f"killed mid-write of {step}")
      launch_seconds = launch.first_step_seconds() or launch_seconds
    if reference.wait() != 0:
      fail(f"reference failed:\n{reference.output[-4000:]}")
  finally:
    for launch in launches:  # none outlives a failure
      if launch.seconds is None:
        launch.proc.kill()
        launch.wait()
  print("\n".join(history))
  print("launch seconds (wall/CPU): " + ", ".join(
      f"{x.name} {x.seconds:.1f}/{x.cpu:.1f}" for x in launches))
  return dict(reference=str(reference_dir), workdir=str(workdir),
              launches=launches, checks=checks, history=history)


def test_every_kill_landed_and_resumed_from_the_newest_complete(chain):
  history = "\n".join(chain["history"])
  kills = [x for x in chain["launches"][1:-1]
           if x.proc.returncode == -signal.SIGKILL]
  assert len(kills) == len(KINDS), history
  # Every kind of moment was hit, the asynchronous write at least twice
  # with its temporary directory still on disk (a write may also finish
  # just before its kill: the poll is not instantaneous).
  reports = [line for x in kills for line in x.reports()]
  for kind in ("into the launch", "in step", "during the write"):
    assert any(kind in line for line in reports), (kind, history)
  assert sum(c.startswith("killed mid-write") for c in chain["checks"]) >= 2, (
      history)
  # Most launches got as far as restoring, and so were checked above.
  assert sum(x.restored() is not None for x in chain["launches"][1:]) >= 6, (
      history)


def test_corrupted_latest_checkpoint_was_skipped_with_a_warning(chain):
  history = "\n".join(chain["history"])
  assert any(c.startswith("corrupted checkpoint") for c in chain["checks"]), (
      history)
  assert any(c.startswith("skipped corrupted") for c in chain["checks"]), (
      history)


def test_final_state_is_bitwise_the_uninterrupted_one(chain):
  history = "\n".join(chain["history"])
  reference, workdir = chain["reference"], chain["workdir"]
  final = chain["launches"][-1]
  assert "Finished at step 20." in final.output, (final.output[-3000:],
                                                  history)
  assert complete_steps(reference) == [16, 18, 20]
  assert complete_steps(workdir) == [16, 18, 20], history
  assert not glob.glob(os.path.join(workdir, "checkpoints", "*tmp*")), history
  for step in (16, 18, 20):
    want, got = _state(reference, step), _state(workdir, step)
    flat_want = jax.tree_util.tree_flatten_with_path(want)[0]
    flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
    assert [k for k, _ in flat_got] == [k for k, _ in flat_want]
    assert len(flat_want) > 20
    for (path, x), (_, y) in zip(flat_got, flat_want):
      assert x.dtype == y.dtype, jax.tree_util.keystr(path)
      np.testing.assert_array_equal(
          x, y, err_msg=f"checkpoint {step} {jax.tree_util.keystr(path)}\n"
          + history)


################################################################################
# The workdir's tokenizer and data, interrupted while being built.
################################################################################


class Killed(BaseException):
  """Stands for SIGKILL: nothing after it runs, not even `except Exception`."""


def _data_config(corpus):
  return ml_collections.ConfigDict(defaults.upgrade(dict(
      seed=0, model=dict(vocab_size=VOCAB),
      data=dict(corpus=str(corpus), format="sentences", tokenizer="",
                data_dir="", max_seq_length=SEQ, objective="sop",
                nsp_negatives_in_sop=False, short_seq_prob=0.1,
                dupe_factor=1, eval_fraction=0.1, num_workers=1))))


def _write_corpus(path):
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    path.write_text("".join(itertools.islice(f, 300)), encoding="utf-8")
  return path


def test_tokenizer_killed_while_writing_is_retrained(tmp_path, monkeypatch):
  """SentencePiece writes its model in place; killed mid-write, that file
  would be there, truncated, and every later run would fail to load it."""
  config = _data_config(_write_corpus(tmp_path / "corpus.txt"))
  workdir = tmp_path / "run"
  train_fn = text_train.train

  def killed_while_writing(files, vocab_size=30000, **options):
    tok = train_fn(files, vocab_size, **options)
    with open(tok.path, "r+b") as f:
      f.truncate(os.path.getsize(tok.path) // 2)
    raise Killed()

  monkeypatch.setattr(text_train, "train", killed_while_writing)
  with pytest.raises(Killed):
    run_tokenizer.ensure(config.data, str(workdir),
                         vocab_size=config.model.vocab_size,
                         seed=config.seed)
  assert not (workdir / "spm" / "spiece.model").exists()
  monkeypatch.undo()
  # The rerun trains afresh; the model is complete and the leftovers gone.
  tok = run_tokenizer.ensure(config.data, str(workdir),
                             vocab_size=config.model.vocab_size,
                             seed=config.seed)
  assert tok.path == str(workdir / "spm" / "spiece.model")
  assert tok.vocab_size == VOCAB
  assert sorted(os.listdir(workdir / "spm")) == ["spiece.model",
                                                 "spiece.vocab"]


def test_data_preparation_killed_midway_is_rebuilt(tmp_path):
  """A killed preparation leaves shards (and a `.tmp` one) but no
  dataset.json, which is written last: the rerun rebuilds the same data."""
  config = _data_config(_write_corpus(tmp_path / "corpus.txt"))
  workdir = tmp_path / "run"
  tok = run_tokenizer.ensure(config.data, str(workdir),
                             vocab_size=config.model.vocab_size,
                             seed=config.seed)
  data = pipeline.ensure_dataset(config.data, str(workdir), tok,
                                 seed=config.seed)
  def files():  # the unit records too (units/unit-*.json)
    return {os.path.relpath(os.path.join(d, n), data):
            (pathlib.Path(d) / n).read_bytes()
            for d, _, names in os.walk(data) for n in names}
  whole = files()
  assert "dataset.json" in whole and len(whole) >= 3
  # What a kill during the last shard leaves behind.
  os.remove(os.path.join(data, "dataset.json"))
  last = sorted(n for n in whole if n.startswith("train-"))[-1]
  os.replace(os.path.join(data, last), os.path.join(data, last + ".tmp"))
  with open(os.path.join(data, last + ".tmp"), "r+b") as f:
    f.truncate(10)
  assert pipeline.ensure_dataset(config.data, str(workdir), tok,
                                 seed=config.seed) == data
  assert files() == whole
