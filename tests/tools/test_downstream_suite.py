"""albert_jax.tools.downstream end to end with the real trainer, on TFDS's
mock data: every GLUE task, SQuAD v1.1 and v2.0, then RACE, then the bundled
tasks (the demo's, from the repository's files); the reports
recomputed by hand from the trials' own final_metrics.json, each trial's
prediction files and the submission files checked. Seeds, medians over them
and reruns are tested on a fake trainer (test_downstream.py); the RACE
subsets high and middle in tests/finetune/tasks/test_finetune_tasks.py.

Every trial is one optimizer step of a tiny ALBERT through the real trainer
(albert_jax.finetune.run), from the command line's own arguments. Two of
them (RTE and SQuAD v2.0, two at a time) are real trials of the command:
each its own `python -m albert_jax.main` process (through a wrapper that
serves mock data), tens of CPU seconds of start-up each. The others are the
same trials (the same arguments, parsed by the same config flag, in the
same workdirs, with the sweep's argument record) run here, in this process,
beforehand, which the command then finds done, checks against its
arguments and reports: the report, the GLUE score and the submission still
cover every task, each from a real fine-tuning run.
"""

import csv
import json
import os
import statistics
import subprocess
import sys
import textwrap

from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import pytest

from albert_jax import config_lib
from albert_jax.interop.pretrained import Pretrained
from albert_jax.model import albert as albert_lib
from albert_jax.model.config import ModelConfig
from albert_jax.text.tokenizer import Tokenizer
from albert_jax.finetune import registry
from albert_jax.finetune import run as ft
from albert_jax.tools import downstream
from albert_jax.tools import sweep
from albert_jax.training import config_check
from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS
from locations import REPO
from locations import TESTS

MOCK_MAIN = textwrap.dedent("""\
    # albert_jax.main on TFDS's mock data.
    import os, sys
    sys.path[:0] = [os.environ["MOCK_TESTS_DIR"],  # and tests/, for locations
                    os.environ["TESTS_DIR"]]
    import tensorflow_datasets as tfds
    from albert_jax import main
    if any(a.endswith("race.py:subset=all") for a in sys.argv):
      # Random RACE rows are inconsistent; serve test_finetune_race's.
      import test_finetune_race
      mock = tfds.testing.mock_data(
          as_dataset_fn=test_finetune_race._fake_race())
    else:
      mock = tfds.testing.mock_data(num_examples=6)
    with mock:
      main.run()
    """)

# One optimizer step on short rows: what every real trial here runs.
ONE_STEP = ["--config.num_train_steps=1", "--config.optimizer.warmup_steps=0",
            "--config.batch_size=4", "--config.data.max_seq_length=32",
            "--config.eval_every_steps=1", "--config.checkpoint_every_steps=1",
            "--config.log_every_steps=1", "--config.async_checkpoints=false",
            "--config.fast_compile=true"]




@pytest.fixture(name="tiny_hf", scope="session")
def fixture_tiny_hf(tiny_spm, tmp_path_factory):
  """A tiny random ALBERT written as an HF directory with `tiny_spm`."""
  section = config_lib.tiny_model(vocab_size=300, max_position_embeddings=64,
                                  num_hidden_layers=1)
  cfg = ModelConfig.from_dict(section.to_dict())
  module = albert_lib.Albert(cfg, pooler=True, heads=())
  params = jax.jit(
      lambda k: module.init(k, jnp.zeros((1, 8), jnp.int32))["params"],
      compiler_options=dict(FAST_COMPILE_OPTIONS))(jax.random.key(0))
  out = tmp_path_factory.mktemp("tiny_hf")
  Pretrained(section, cfg, params,
             tokenizer=Tokenizer.from_file(tiny_spm)).to_hf(str(out))
  return str(out)


def run_real(model, root, suite, seeds, parallel, extra=()):
  """The command in a fresh process, on TFDS mock data, one step a trial."""
  pytest.importorskip("tensorflow_datasets")
  mock = root.parent / "mock_main.py"
  mock.write_text(MOCK_MAIN)
  return subprocess.run(
      [sys.executable, "-m", "albert_jax.tools.downstream", model,
       f"--suite={suite}", f"--seeds={seeds}", f"--parallel={parallel}",
       f"--workdir_root={root}", f"--main_module={mock}", "--", *ONE_STEP,
       *extra],
      cwd=REPO, capture_output=True, text=True, check=False,
      env={**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
           "MOCK_TESTS_DIR": str(TESTS / "finetune" / "tasks"),
           "TESTS_DIR": str(TESTS)})


def run_here(model, root, names, extra=()):
  """The command's trials of `names` (seed 0), run in this process before
  it: the arguments it gives each trial (`downstream.trials`, then the
  sweep's command line), parsed by the config flag albert_jax.main parses
  them with, checked as main checks them, fine-tuned by the trainer main
  calls, on the mock data MOCK_MAIN serves; each workdir gets the sweep's
  record of its arguments, which the command compares with its own."""
  tfds = pytest.importorskip("tensorflow_datasets")
  if str(TESTS / "finetune" / "tasks") not in sys.path:  # as MOCK_MAIN does
    sys.path.insert(0, str(TESTS / "finetune" / "tasks"))
  import test_finetune_race  # pylint: disable=g-import-not-at-top
  planned = downstream.trials(model, names, 1, "paper")
  for name, (config, trial) in planned.items():
    workdir = f"{root}/{name}"
    cmd = sweep._main_args(config, workdir, trial, [*ONE_STEP, *extra])  # pylint: disable=protected-access
    values = flags.FlagValues()
    argv = ["main", *cmd]
    config_flags.DEFINE_config_file("config", None, flag_values=values,
                                    lock_config=True, sys_argv=argv)
    flags.DEFINE_string("workdir", None, "", flag_values=values)
    values(argv)
    check = values.config
    config_check.check(check, registry.task_names())
    os.makedirs(workdir)
    with open(f"{workdir}/{sweep.ARGS_FILE}", "w", encoding="utf-8") as f:
      json.dump(sweep._recorded_args(cmd), f)  # pylint: disable=protected-access
    mock = (tfds.testing.mock_data(
        as_dataset_fn=test_finetune_race._fake_race())  # pylint: disable=protected-access
            if name.startswith("race/") else
            tfds.testing.mock_data(num_examples=6))
    with mock:
      ft.run(check, values.workdir)


def check_real_report(root, names, seeds):
  """The report against the trials' own final_metrics.json, by hand."""
  report = json.loads((root / "report.json").read_text())
  scores = {}
  for name in names:
    task = downstream.TASKS[name]
    runs = [json.loads((root / name / f"seed={k}" / "final_metrics.json")
                       .read_text()) for k in range(seeds)]
    entry = report["tasks"][name]
    assert entry["finished"] == list(range(seeds))
    for label, key in task.metrics:
      values = [task.scale * r[key] for r in runs]
      assert entry["metrics"][label] == pytest.approx(
          {"median": statistics.median(values), "min": min(values),
           "max": max(values)}), (name, label)
    per_seed = [task.scale * statistics.mean(r[k] for k in task.score_keys)
                for r in runs]
    assert entry["score"] == pytest.approx(statistics.median(per_seed))
    scores[name] = entry["score"]
    wall = sum(r["goodput"]["wall_seconds"] for r in runs)
    assert wall > 0 and entry["wall_seconds"] == pytest.approx(wall)
    assert entry["device_hours"] == pytest.approx(
        sum(r["goodput"]["wall_seconds"] * r["devices"] for r in runs)
        / 3600)
  glue = [s for n, s in scores.items() if downstream.TASKS[n].glue]
  if glue:
    assert report["glue"]["score"] == pytest.approx(statistics.mean(glue))
  return report


# Each task's prediction files (the trial's predictions/ folder), written
# from its best checkpoint.
GLUE_FILES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP",
              "stsb": "STS-B", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
PREDICTIONS = {
    **{t: {"validation_predictions.tsv", f"{name}.tsv"}
       for t, name in GLUE_FILES.items()},
    "mnli": {"validation_matched_predictions.tsv",
             "validation_mismatched_predictions.tsv", "MNLI-m.tsv",
             "MNLI-mm.tsv"},
    "squad1.1": {"predictions.json", "nbest_predictions.json"},
    "squad2.0": {"predictions.json", "nbest_predictions.json",
                 "null_odds.json"},
    "race": set(),
    **{t: {"eval_predictions.tsv", "test_predictions.tsv"}
       for t in ("source", "spam")},
}


def check_trials(root, names):
  """Each trial trained its step, kept it as the best and wrote its
  prediction files from it, each with content."""
  for name in names:
    trial = root / name / "seed=0"
    final = json.loads((trial / "final_metrics.json").read_text())
    assert final["step"] == 1 and final["best_step"] == 1, (name, final)
    written = {os.path.basename(p) for p in final["predictions"]}
    assert written and PREDICTIONS[name] <= written, (name, written)
    for path in final["predictions"]:
      assert os.path.getsize(path) > 0, path
      if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
          assert json.load(f), path


# The command's real trials (their own processes, two at a time): a GLUE
# classification task (whose test file is checked byte for byte against the
# submission's copy) and SQuAD v2.0's span head; every other task is run in
# this process beforehand (`run_here`).
REAL = ("rte", "squad2.0")


def test_every_task_on_mock_data(tiny_hf, tmp_path, monkeypatch):
  """Every GLUE task and SQuAD v1.1/v2.0 through the command (RTE and
  SQuAD v2.0 as its own trial processes, two at a time; the rest run
  beforehand here, found done and reported): the report against the trials'
  final_metrics.json, every trial's step, best step and prediction files,
  the printed table and GLUE score, the submission folder (every GLUE file,
  in index order; RTE's the 6 mock rows, labels by name, the trial's bytes).
  Then RACE (all: high and middle dev, test): run here, reported by the
  command, each dev set scored. Then the bundled suite likewise."""
  monkeypatch.chdir(REPO)  # as the command runs: configs/ relative
  root = tmp_path / "runs"
  names = downstream.parse_suite("glue,squad")
  run_here(tiny_hf, root, [n for n in names if n not in REAL])
  result = run_real(tiny_hf, root, "glue,squad", 1, 2)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  for name in names:  # the ones run here found done, the others run
    said = "ok in" if name in REAL else "done, skipped"
    assert f"] {name}/seed=0: {said}" in result.stdout, (name, result.stdout)
  report = check_real_report(root, names, 1)
  check_trials(root, names)
  assert report["glue"]["tasks"] == sorted(downstream.GLUE)
  assert not report["glue"]["partial"]
  for name in names:
    assert f"| {name} | " in result.stdout
  assert "GLUE score (macro-average of task scores)" in result.stdout
  assert "device-hours" in result.stdout
  submitted = sorted((root / "submission").iterdir())
  assert [p.name for p in submitted] == sorted(
      f for n in downstream.GLUE for f in downstream.TASKS[n].files
      if f != "AX.tsv")
  for path in submitted:
    with open(path, newline="", encoding="utf-8") as f:
      rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and len(rows) > 1, path.name
    indexes = [int(r[0]) for r in rows[1:]]
    assert indexes == sorted(indexes), path.name
  with open(root / "submission" / "RTE.tsv", newline="",
            encoding="utf-8") as f:
    rows = list(csv.reader(f, delimiter="\t"))
  assert len(rows) == 7  # the 6 mock rows
  assert {r[1] for r in rows[1:]} <= {"entailment", "not_entailment"}
  assert (root / "submission" / "RTE.tsv").read_bytes() == (
      root / "rte" / "seed=0" / "predictions" / "RTE.tsv").read_bytes()
  # RACE's question+option budget (128 tokens) needs more than the 32 the
  # others run at; `--` arguments go to every trial, so it runs on its own.
  root = tmp_path / "race"
  run_here(tiny_hf, root, ["race"], ["--config.data.max_qa_length=12"])
  result = run_real(tiny_hf, root, "race", 1, 1,
                    ["--config.data.max_qa_length=12"])
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "] race/seed=0: done, skipped" in result.stdout, result.stdout
  report = check_real_report(root, ["race"], 1)
  check_trials(root, ["race"])
  final = json.loads((root / "race" / "seed=0" / "final_metrics.json")
                     .read_text())
  for part in ("high", "middle", "all"):  # RACE's dev sets, each scored
    assert any(k.startswith("eval_") and part in k for k in final), final
  assert "| race | acc " in result.stdout and report["glue"] is None
  # The bundled suite (the demo's two labelled tasks, from the repository's
  # own files, each cut by the trial's seed into its workdir): run here,
  # reported by the command, dev accuracy scored and test accuracy beside.
  root = tmp_path / "bundled"
  run_here(tiny_hf, root, ["source", "spam"])
  result = run_real(tiny_hf, root, "bundled", 1, 1)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  for name in ("source", "spam"):
    assert f"] {name}/seed=0: done, skipped" in result.stdout, result.stdout
    assert f"| {name} | acc " in result.stdout, result.stdout
  report = check_real_report(root, ["source", "spam"], 1)
  check_trials(root, ["source", "spam"])
  assert report["glue"] is None
