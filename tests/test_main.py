"""The CLI end to end: tokenizer and data built in the workdir, training,
eval, checkpoints, TensorBoard events, the recorded config, and errors."""

import gzip
import json
import os
import subprocess
import sys

from locations import CORPUS
from locations import REPO
import pytest


def _cli(*args, timeout=600):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
      [sys.executable, "-m", "albert_jax.main", *args], cwd=REPO, env=env,
      capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
  """~60 documents in the official format, gzipped."""
  out = tmp_path_factory.mktemp("corpus") / "moby.txt.gz"
  with gzip.open(CORPUS.parent / "moby_dick.txt.gz", "rt",
                 encoding="utf-8") as f, gzip.open(out, "wt",
                                                   encoding="utf-8") as g:
    docs = 0
    for line in f:
      g.write(line)
      docs += line.strip() == ""
      if docs >= 60:
        break
  return str(out)


TINY_RUN = [
    "--config=configs/tiny.py",
    "--config.num_train_steps=12",
    "--config.batch_size=8",
    "--config.data.max_seq_length=32",
    "--config.masking.max_predictions=5",
    "--config.data.eval_fraction=0.2",
    "--config.optimizer.warmup_steps=2",
    "--config.log_every_steps=4",
    "--config.eval_every_steps=6",
    "--config.eval_batches=2",
    "--config.checkpoint_every_steps=6",
    "--config.model.vocab_size=600",
    # XLA:CPU's quick pipeline: nothing here checks optimised numerics, and
    # it compiles the 12-step run's steps in a third of the time.
    "--config.fast_compile=true",
]


@pytest.fixture(scope="module")
def trained_run(small_corpus, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("run"))
  proc = _cli(*TINY_RUN, f"--config.data.corpus={small_corpus}",
              f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir, proc


def test_run_builds_data_trains_and_reports(trained_run):
  workdir, proc = trained_run
  # Tokenizer and data were built in the workdir on first use.
  assert os.path.exists(os.path.join(workdir, "spm", "spiece.model"))
  assert os.path.exists(os.path.join(workdir, "data", "dataset.json"))
  # Progress bar and the closing summary.
  assert "12/12" in proc.stderr
  assert "held-out MLM accuracy" in proc.stdout
  assert "unigram-frequency baseline" in proc.stdout
  assert "held-out SOP accuracy" in proc.stdout
  assert "majority-class share" in proc.stdout
  final = json.load(open(os.path.join(workdir, "final_metrics.json")))
  assert final["step"] == 12
  for key in ("eval_mlm_accuracy", "eval_mlm_loss", "eval_sop_accuracy",
              "eval_unigram_baseline_accuracy"):
    assert 0.0 <= final[key] < 20.0, key
  assert 0.5 <= final["eval_sentence_majority_share"] <= 1.0


def test_run_records_config_commit_and_metrics(trained_run):
  workdir, _ = trained_run
  config = json.load(open(os.path.join(workdir, "config.json")))
  assert config["num_train_steps"] == 12
  assert config["model"]["vocab_size"] == 600
  commit = open(os.path.join(workdir, "git_commit.txt")).read().strip()
  assert commit  # a hash, or "unknown" outside a checkout
  events = os.listdir(os.path.join(workdir, "tensorboard"))
  assert any(e.startswith("events.out.tfevents") for e in events)
  rows = [json.loads(l) for l in open(
      os.path.join(workdir, "tensorboard", "metrics.jsonl"))]
  train_keys = set().union(*(r.keys() for r in rows if "train/loss" in r))
  for key in ("train/loss", "train/mlm_accuracy", "train/sop_accuracy",
              "train/learning_rate", "train/grad_norm", "train/param_norm",
              "train/seq_per_sec", "train/tokens_per_sec",
              "train/padding_fraction", "train/real_tokens_per_sec"):
    assert key in train_keys, key
  assert [r["step"] for r in rows if "train/loss" in r] == [4, 8, 12]
  assert any("eval/mlm_accuracy" in r for r in rows)
  # Checkpoints at 6 and 12.
  steps = sorted(int(d) for d in os.listdir(os.path.join(workdir,
                                                        "checkpoints"))
                 if d.isdigit())
  assert steps == [6, 12]


def test_rerun_of_finished_run_is_a_no_op(trained_run, small_corpus):
  workdir, _ = trained_run
  before = json.load(open(os.path.join(workdir, "final_metrics.json")))
  proc = _cli(*TINY_RUN, f"--config.data.corpus={small_corpus}",
              f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  after = json.load(open(os.path.join(workdir, "final_metrics.json")))
  assert after == before


def test_vocab_mismatch_names_the_fix(trained_run, small_corpus, tmp_path):
  run = [a for a in TINY_RUN if "vocab_size" not in a]
  # The 600-piece tokenizer the trained run built in its workdir (read
  # only), and a 1000-word model (tiny.py's) asked for with it.
  workdir, _ = trained_run
  with open(os.path.join(workdir, "spm", "spiece.vocab"),
            encoding="utf-8") as f:
    assert sum(1 for _ in f) == 600
  proc = _cli(*run, f"--config.data.corpus={small_corpus}",
              f"--config.data.tokenizer={workdir}/spm/spiece.model",
              f"--workdir={tmp_path / 'other'}")
  assert proc.returncode != 0
  assert "--config.model.vocab_size=600" in proc.stderr


def test_unknown_config_key_suggests_closest(tmp_path):
  proc = _cli("--config=configs/tiny.py", "--config.optimizer.learnig_rate=1",
              f"--workdir={tmp_path}", timeout=120)
  assert proc.returncode != 0
  assert "learnig_rate" in proc.stderr
  assert "learning_rate" in proc.stderr


def test_unwritable_workdir_is_a_clear_error(tmp_path):
  target = tmp_path / "file"
  target.write_text("not a directory")
  proc = _cli("--config=configs/tiny.py", f"--workdir={target}/sub",
              timeout=120)
  assert proc.returncode == 1
  assert "error: Cannot write to workdir" in proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_bad_optimizer_values_are_one_line_before_anything_is_written(
    tmp_path):
  workdir = tmp_path / "w"
  proc = _cli("--config=configs/tiny.py", f"--workdir={workdir}",
              "--config.optimizer.learning_rate=-0.001",
              "--config.optimizer.b2=1.0", timeout=120)
  assert proc.returncode == 1
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert lines == [
      "error: config.optimizer.learning_rate=-0.001 must be a finite number "
      "> 0, e.g. --config.optimizer.learning_rate=0.001; "
      "config.optimizer.b2=1.0 must be in [0, 1), e.g. "
      "--config.optimizer.b2=0.999."], proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert not workdir.exists()
  # --traceback shows where it came from.
  proc = _cli("--config=configs/tiny.py", f"--workdir={workdir}",
              "--config.optimizer.learning_rate=-0.001", "--traceback",
              timeout=120)
  assert "Traceback" in proc.stderr and "optimizer.py" in proc.stderr


def test_a_missing_workdir_and_a_config_syntax_error_are_one_line(tmp_path):
  """Not 43 lines of flag help, nor a traceback through runpy and absl."""
  from plugin_noise import without_plugin_noise  # pylint: disable=g-import-not-at-top
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config(:\n  pass\n")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  runs = {
      ("--config=configs/tiny.py",): (
          "error: --workdir is required: the directory the run keeps its "
          "checkpoints, logs and data in (and resumes from), e.g. "
          "--workdir=/tmp/albert_run."),
      (f"--config={bad}", f"--workdir={tmp_path / 'w'}"): (
          f"error: config file {bad}, line 1: invalid syntax ('def "
          "get_config(:'); fix the file, or give another --config.")}
  procs = {args: subprocess.Popen(
      [sys.executable, "-m", "albert_jax.main", *args], cwd=REPO, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for args in runs}
  for args, line in runs.items():
    _, err = procs[args].communicate(timeout=300)
    assert procs[args].returncode == 2, err[-2000:]
    assert without_plugin_noise(err).strip().splitlines() == [line], err[-2000:]
  assert not (tmp_path / "w").exists()
