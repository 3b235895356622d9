"""Resuming is exact: an interrupted run ends bitwise where a straight one does.

Drives the real CLI (`python -m albert_jax.main --config=configs/tiny.py...`)
in subprocesses on a tiny prepared dataset, N = 12 steps, checkpoints every 3,
dropout on (so the RNG state matters too):

  straight      0 → 12 uninterrupted: the reference.
  killed        0 → 8, SIGKILLed from here once checkpoint 6 is durable
                (its directory renamed from `6.orbax-checkpoint-tmp`).
  terminated    resumes from 6, saves 9, gets SIGTERM during step 11:
                finishes the step, saves 11, exits 0 with a message.
  resumed       resumes from 11 → 12.

Checkpoints 9 (written after the SIGKILL resume) and 12 (after the SIGTERM
resume) hold the same full state (params, optimizer state, step, RNG) as the
straight run's, bit for bit, and the last train state in memory of both
final processes is the same too.

The tiny model's steps take milliseconds, so a signal sent from outside
cannot be timed to land mid-run. A small hook, installed before the CLI
starts, wraps the train step: it holds the `killed` run at step 8 until the
test kills it, and sends SIGTERM to its own process at the start of step
11 (the trainer's real handler does the rest). It also dumps the final
in-memory parameters, the trainer's own view to compare `load_pretrained`
against. Processes after the first load the compiled steps from a
persistent compilation cache (the session's, shared with the other tests
that run this config), and XLA's backend optimisations are off
(--config.fast_compile and XLA_FLAGS, the same for every launch), which keeps
the four launches within budget.
"""

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from albert_jax.interop.pretrained import load_pretrained
from albert_jax.model import albert as albert_lib
from albert_jax.text.tokenizer import Tokenizer
from locations import REPO
VOCAB, SEQ, STEPS, EVERY = 300, 32, 12, 3
KILL_AFTER, HANG_AT, TERM_AT = 6, 8, 10  # TERM_AT: state step when signalled
TIMEOUT = 300

# Runs before `albert_jax.main` in each subprocess; see the module docstring.
_HOOK = r"""
import atexit, os, signal, sys, time
import jax, numpy as np
from albert_jax.training import step as step_lib

hang_at = int(os.environ.get("RESUME_TEST_HANG_AT", -1))
term_at = int(os.environ.get("RESUME_TEST_SIGTERM_AT", -1))
int_at = int(os.environ.get("RESUME_TEST_SIGINT_AT", -1))
raise_at = int(os.environ.get("RESUME_TEST_RAISE_AT", -1))
dump = os.environ.get("RESUME_TEST_DUMP")
last = {}
make = step_lib.jit_train_step

def jit_train_step(*args, **kwargs):
  run = make(*args, **kwargs)
  def hooked(state, batch):
    step = int(jax.device_get(state["step"]))
    if step == hang_at:
      print(f"HOOK: holding at step {step}", flush=True)
      time.sleep(3600)
    if step == term_at:
      print(f"HOOK: SIGTERM at step {step}", flush=True)
      os.kill(os.getpid(), signal.SIGTERM)
    if step == int_at:
      print(f"HOOK: SIGINT at step {step}", flush=True)
      os.kill(os.getpid(), signal.SIGINT)
    if step == raise_at:
      print(f"HOOK: raising at step {step}", flush=True)
      raise RuntimeError("an error from the hook")
    out = run(state, batch)
    last["state"] = out[0]
    return out
  return hooked

step_lib.jit_train_step = jit_train_step

@atexit.register
def _dump():
  if dump and "state" in last:
    flat = jax.tree_util.tree_flatten_with_path(last["state"]["params"])[0]
    np.savez(dump, **{jax.tree_util.keystr(k): np.asarray(v)
                      for k, v in flat})

from albert_jax import main
sys.argv = ["albert_jax.main"] + sys.argv[1:]
main.run()
"""


@pytest.fixture(name="dataset", scope="module")
def fixture_dataset(tiny_sop_dataset):
  """conftest's 300-piece tokenizer (loaded) and ≈200 SOP instances of
  length 32."""
  tokenizer, data_dir = tiny_sop_dataset
  with open(os.path.join(data_dir, "dataset.json"), encoding="utf-8") as f:
    meta = json.load(f)
  assert (meta["vocab_size"], meta["max_seq_length"]) == (VOCAB, SEQ)
  assert meta["splits"]["train"]["instances"] >= 100
  return Tokenizer.from_file(tokenizer), data_dir


def _command(workdir, dataset):
  tok, data_dir = dataset
  return [sys.executable, "-c", _HOOK,
          "--config=configs/tiny.py:dropout=0.1", f"--workdir={workdir}",
          f"--config.data.tokenizer={tok.path}",
          f"--config.data.data_dir={data_dir}",
          f"--config.model.vocab_size={tok.vocab_size}",
          f"--config.model.max_position_embeddings={SEQ}",
          f"--config.data.max_seq_length={SEQ}",
          "--config.masking.max_predictions=5", "--config.batch_size=8",
          f"--config.num_train_steps={STEPS}",
          "--config.optimizer.warmup_steps=2",
          f"--config.checkpoint_every_steps={EVERY}",
          "--config.keep_checkpoints=10", f"--config.log_every_steps={EVERY}",
          "--config.eval_batches=0", "--config.fast_compile=true"]


class Run:
  """One CLI process, its output in files (so nothing blocks on a pipe)."""

  def __init__(self, name, workdir, dataset, root, **hooks):
    self.name, self.workdir = name, str(workdir)
    self.log = root / f"{name}.log"
    self.dump = root / f"{name}_params.npz"
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "RESUME_TEST_DUMP": str(self.dump)}
    # LLVM's optimisations dominate the compile time of a tiny model on CPU
    # and are irrelevant to resuming: every process runs the same flags
    # (and --config.fast_compile). The compilation cache is the session's
    # (conftest's JAX_COMPILATION_CACHE_DIR): these runs, test_lease's,
    # test_gcs_journey's and test_gcs_outage's compile the same programs.
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    for key, value in hooks.items():
      env[f"RESUME_TEST_{key.upper()}"] = str(value)
    self._file = open(self.log, "w", encoding="utf-8")
    self.start = time.time()
    self.proc = subprocess.Popen(_command(workdir, dataset), cwd=REPO,
                                 env=env, stdout=self._file,
                                 stderr=subprocess.STDOUT)
    self.seconds = None

  def wait(self, timeout=TIMEOUT):
    try:
      self.proc.wait(timeout=timeout)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()
        self.proc.wait()
      self._file.close()
      self.seconds = time.time() - self.start
    return self.proc.returncode

  @property
  def output(self):
    return self.log.read_text(encoding="utf-8")

  def describe(self):
    return (f"--- {self.name}: rc {self.proc.returncode}, output tail:\n"
            + self.output[-6000:])


def _wait_for_checkpoint(run, step, timeout=TIMEOUT):
  """Polls until checkpoints/<step> exists (renamed from its tmp name)."""
  path = os.path.join(run.workdir, "checkpoints", str(step))
  deadline = time.time() + timeout
  while not os.path.isdir(path):
    if run.proc.poll() is not None:
      run.wait()
      pytest.fail(f"{run.name} exited before checkpoint {step}.\n"
                  + run.describe())
    if time.time() > deadline:
      run.proc.kill()
      run.wait()
      pytest.fail(f"No checkpoint {step} after {timeout}s.\n"
                  + run.describe())
    time.sleep(0.05)


@pytest.fixture(scope="module")
def runs(dataset, tmp_path_factory):
  root = tmp_path_factory.mktemp("resume")
  straight_dir, resumed_dir = root / "straight", root / "interrupted"
  started = []

  def launch(name, workdir, **hooks):
    started.append(Run(name, workdir, dataset, root, **hooks))
    return started[-1]

  try:
    # The straight run fills the compilation cache; the others start once
    # it holds the init and train steps (its first checkpoint).
    straight = launch("straight", straight_dir)
    _wait_for_checkpoint(straight, EVERY)
    killed = launch("killed", resumed_dir, hang_at=HANG_AT)
    _wait_for_checkpoint(killed, KILL_AFTER)
    killed.proc.send_signal(signal.SIGKILL)
    killed.wait()
    assert straight.wait() == 0, straight.describe()
    left_by_kill = sorted(os.listdir(resumed_dir / "checkpoints"))
    terminated = launch("terminated", resumed_dir, sigterm_at=TERM_AT)
    terminated.wait()
    left_by_term = sorted(os.listdir(resumed_dir / "checkpoints"))
    resumed = launch("resumed", resumed_dir)
    resumed.wait()
  finally:
    for run in started:  # none outlives a failure
      if run.seconds is None:
        run.proc.kill()
        run.wait()
  print("\nsubprocess seconds: " + ", ".join(
      f"{r.name} {r.seconds:.1f}" for r in started))
  return dict(straight=straight, killed=killed, terminated=terminated,
              resumed=resumed, left_by_kill=left_by_kill,
              left_by_term=left_by_term)


def _state(workdir, step):
  """A checkpoint's whole train state as NumPy arrays."""
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  with warnings.catch_warnings():
    # Restoring onto the saved (single-device) sharding is fine here.
    warnings.filterwarnings("ignore", "Sharding info not provided")
    state = ocp.PyTreeCheckpointer().restore(path)
  return jax.tree.map(np.asarray, state)


def _assert_bitwise(a, b, what):
  flat_a = jax.tree_util.tree_flatten_with_path(a)[0]
  flat_b = jax.tree_util.tree_flatten_with_path(b)[0]
  assert [k for k, _ in flat_a] == [k for k, _ in flat_b], what
  assert flat_a, what
  for (path, x), (_, y) in zip(flat_a, flat_b):
    assert x.dtype == y.dtype, (what, jax.tree_util.keystr(path))
    np.testing.assert_array_equal(
        x, y, err_msg=f"{what}: {jax.tree_util.keystr(path)}")


def _dumped(run):
  assert run.dump.exists(), f"{run.name} dumped no parameters"
  return dict(np.load(run.dump))


def test_straight_run(runs):
  straight = runs["straight"]
  assert straight.proc.returncode == 0, straight.describe()
  assert "Finished at step 12." in straight.output, straight.describe()
  steps = sorted(os.listdir(os.path.join(straight.workdir, "checkpoints")))
  assert steps == ["12", "3", "6", "9"]


def test_sigkill_then_resume_is_bitwise(runs):
  killed, terminated = runs["killed"], runs["terminated"]
  assert killed.proc.returncode == -signal.SIGKILL, killed.describe()
  assert "HOOK: holding at step 8" in killed.output, killed.describe()
  # Killed after step 8: only checkpoints 3 and 6, nothing half-written that
  # a resume could pick up.
  assert [n for n in runs["left_by_kill"]
          if ".orbax-checkpoint-tmp" not in n] == ["3", "6"]
  assert "Resumed from step 6" in terminated.output, terminated.describe()
  # Steps 7-9 re-run after the kill give the straight run's state exactly.
  straight = runs["straight"].workdir
  for step in (6, 9):
    _assert_bitwise(_state(terminated.workdir, step), _state(straight, step),
                    f"checkpoint {step}")


def test_sigterm_saves_and_exits_cleanly(runs):
  terminated = runs["terminated"]
  assert terminated.proc.returncode == 0, terminated.describe()
  assert "HOOK: SIGTERM at step 10" in terminated.output
  assert "Stopped by SIGTERM after step 11" in terminated.output, (
      terminated.describe())
  assert "Finished" not in terminated.output
  assert runs["left_by_term"] == ["11", "3", "6", "9"]


def test_resume_after_sigterm_matches_straight_run(runs):
  resumed, straight = runs["resumed"], runs["straight"]
  assert resumed.proc.returncode == 0, resumed.describe()
  assert "Resumed from step 11" in resumed.output, resumed.describe()
  assert "Finished at step 12." in resumed.output, resumed.describe()
  # The whole train state on disk (params, optimizer state, step, RNG) ...
  _assert_bitwise(_state(resumed.workdir, 12), _state(straight.workdir, 12),
                  "checkpoint 12")
  # ... and the parameters the trainers held in memory at the end.
  _assert_bitwise(_dumped(resumed), _dumped(straight), "final parameters")


def test_steps_redone_after_the_sigkill_are_lost_progress(runs):
  """Killed after step 8 with checkpoint 6: the next session books steps 7
  and 8 as lost progress; goodput adds the three sessions up."""
  with open(os.path.join(runs["resumed"].workdir, "goodput.json"),
            encoding="utf-8") as f:
    sessions = json.load(f)["sessions"]
  assert [(s["start_step"], s["reached"], s["lost_steps"])
          for s in sessions] == [(0, 8, 0), (6, 11, 2), (11, 12, 0)]
  assert sessions[1]["seconds"]["lost_progress"] > 0  # step 8 (7 compiled)
  terminated, resumed = runs["terminated"], runs["resumed"]
  assert ("Lost progress: 2 steps run again after a restart"
          in terminated.output), terminated.describe()
  assert "wall time over 3 sessions." in resumed.output, resumed.describe()


def test_load_pretrained_matches_trainer(runs, dataset):
  straight = runs["straight"]
  trained = _dumped(straight)
  model = load_pretrained(straight.workdir)
  assert model.step == STEPS and model.heads == ("mlm", "sop")
  flat = {jax.tree_util.keystr(k): np.asarray(v) for k, v in
          jax.tree_util.tree_flatten_with_path(model.params)[0]}
  _assert_bitwise(flat, trained, "load_pretrained vs trainer")
  # The tokenizer is the one config.data.tokenizer names.
  tok = dataset[0]
  text = "The state of the union is strong."
  assert model.tokenizer is not None
  assert model.tokenizer.encode(text) == tok.encode(text)
  # Outputs are those of Albert.apply with the trainer's parameters.
  pair = tok.encode_pair(text, "We will meet again next year.")
  ids, types, mask = (jnp.asarray([pair[k]]) for k in (
      "input_ids", "token_type_ids", "attention_mask"))
  module = albert_lib.Albert(model.model_config, heads=("mlm", "sop"))
  params = jax.tree.unflatten(jax.tree.structure(model.params),
                              [jnp.asarray(trained[k]) for k in flat])
  want = jax.jit(lambda p, i, t, m: module.apply({"params": p}, i, t, m))(
      params, ids, types, mask)
  got = model(ids, types, mask)
  for key in ("sequence_output", "pooled_output", "mlm_logits",
              "sop_logits"):
    np.testing.assert_array_equal(np.asarray(got[key]),
                                  np.asarray(want[key]), err_msg=key)
  assert model.model_config.hidden_dropout_prob == 0.1  # as trained


def _complete_steps(workdir):
  """(finished checkpoint steps, names of unfinished `*tmp*` entries)."""
  root = os.path.join(workdir, "checkpoints")
  names = os.listdir(root) if os.path.isdir(root) else []
  return (sorted(int(n) for n in names if n.isdigit()),
          sorted(n for n in names if "tmp" in n))


def test_sigint_saves_and_exits_cleanly(dataset, tmp_path):
  """Ctrl-C is handled like SIGTERM: the step in progress finishes, is
  saved, and the run exits 0 saying how to resume."""
  run = Run("interrupted", tmp_path / "w", dataset, tmp_path,
            sigint_at=TERM_AT)
  assert run.wait() == 0, run.describe()
  assert "HOOK: SIGINT at step 10" in run.output
  assert "Stopped by SIGINT after step 11" in run.output, run.describe()
  assert "the same command resumes" in run.output
  assert _complete_steps(run.workdir) == ([3, 6, 9, 11], [])


def test_an_error_keeps_the_checkpoint_being_written(dataset, tmp_path):
  """An exception right after a periodic save starts (asynchronously) waits
  for that save before it propagates: step 9 is finished on disk, not left
  as a temporary directory that a resume would skip."""
  run = Run("failing", tmp_path / "w", dataset, tmp_path, raise_at=9)
  assert run.wait() != 0, run.describe()
  assert "HOOK: raising at step 9" in run.output
  assert "an error from the hook" in run.output
  assert _complete_steps(run.workdir) == ([3, 6, 9], []), run.describe()



def test_packed_run_resumes_bitwise(tiny_spm, tmp_path):
  """A packed run (data.pack=2, dropout on) that lost its last checkpoint
  resumes from the one before and ends bitwise where the straight run
  does: a packed batch, too, is a function of (seed, step) alone. In
  process (`pretrain.run`), 6 steps; the resumed workdir is a copy of the
  straight one with checkpoint 6 removed."""
  import gzip  # pylint: disable=g-import-not-at-top
  import itertools  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from albert_jax.data import prepare  # pylint: disable=g-import-not-at-top
  from albert_jax.training import pretrain  # pylint: disable=g-import-not-at-top
  from albert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from locations import CORPUS  # pylint: disable=g-import-not-at-top
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    lines = [" ".join(l.split()[:4]) for l in itertools.islice(f, 300)]
  # Two short sentences a document: instances of about half a row, so
  # most rows hold two.
  docs = [[s for s in lines[i:i + 2] if s] for i in range(0, len(lines), 2)]
  data_dir = str(tmp_path / "data")
  meta = prepare.prepare(iter(docs), prepare.PrepareConfig(
      tokenizer=tiny_spm, output_dir=data_dir, max_seq_length=SEQ, pack=2,
      docs_per_block=50, seed=0), progress=None)
  assert meta["splits"]["train"]["rows"] < meta["splits"]["train"][
      "instances"]
  c = config_lib.base_config(config_lib.tiny_model(
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
  c.data.update(tokenizer=tiny_spm, data_dir=data_dir, max_seq_length=SEQ,
                pack=2)
  c.model.update(vocab_size=VOCAB, max_position_embeddings=SEQ)
  c.masking.max_predictions = 5
  c.update(batch_size=8, num_train_steps=6, checkpoint_every_steps=3,
           keep_checkpoints=10, log_every_steps=3, eval_batches=0,
           async_checkpoints=False, fast_compile=True)
  c.optimizer.warmup_steps = 2
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  pretrain.run(c, straight)
  # batch_size counts instances: the run took the rows that hold 8, and its
  # recipe keeps the number for every resume.
  split = meta["splits"]["train"]
  with open(os.path.join(straight, "recipe.json"), encoding="utf-8") as f:
    rows = json.load(f)["rows_per_step"]
  assert rows == round(8 * split["rows"] / split["instances"]) < 8, split
  # The same run again would be this one, byte for byte: a copy of its
  # workdir stands for it.
  shutil.copytree(straight, resumed)
  shutil.rmtree(os.path.join(resumed, "checkpoints", "6"))
  pretrain.run(c, resumed)  # from checkpoint 3
  _assert_bitwise(_state(straight, 6), _state(resumed, 6),
                  "packed straight vs resumed")
  assert not np.array_equal(*(
      _state(straight, s)["params"]["embeddings"]["word_embeddings"][
          "embedding"] for s in (3, 6)))
