"""albert_jax.tools.downstream: the suite, its report, resume and submission.

The report's arithmetic is checked on hand-written final_metrics.json
values for every task; the orchestration (seeds, parallel trials, a kill
and the resume, the submission folder) with a fake trainer that writes what
the real one writes, so those runs take seconds. The whole suite end to
end with the real trainer on TFDS's mock data is test_downstream_suite.py
(each real trial is a process of its own, tens of seconds on a CPU).
"""

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from albert_jax.tools import downstream
from albert_jax.tools import sweep
from locations import REPO
from test_sweep import start_together

FAKE_MAIN = textwrap.dedent("""\
    # A trainer that writes what albert_jax.main's fine-tuning writes: its
    # metrics come from $FAKE_METRICS[task/seed=K], and a GLUE run's test
    # predictions name their seed.
    import json, os, sys, time
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    workdir = args["--workdir"]
    task = os.path.basename(os.path.dirname(workdir))
    name = f"{task}/{os.path.basename(workdir)}"
    os.makedirs(workdir, exist_ok=True)
    root = os.path.dirname(os.path.dirname(workdir))
    with open(os.path.join(root, "calls.txt"), "a") as f:
      f.write(json.dumps([name, time.time()] + sys.argv[1:]) + "\\n")
    if name in os.environ.get("FAKE_HANG", "").split(","):
      open(os.path.join(workdir, "hanging"), "w").close()
      time.sleep(600)
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    with open(os.environ["FAKE_METRICS"]) as f:
      metrics = json.load(f)[name]
    pred = os.path.join(workdir, "predictions")
    os.makedirs(pred, exist_ok=True)
    files = {"rte": ["RTE.tsv"], "mnli": ["MNLI-m.tsv", "MNLI-mm.tsv"],
             "stsb": ["STS-B.tsv"]}.get(task, [])
    seed = int(args["--config.seed"])
    for file in files:
      label = ("entailment", "not_entailment")[seed % 2]
      if file == "STS-B.tsv":
        label = f"{seed:.6f}"
      with open(os.path.join(pred, file), "w") as f:
        f.write("index\\tprediction\\n" + "".join(
            f"{i}\\t{label}\\n" for i in range(3)))
    with open(os.path.join(workdir, "final_metrics.json"), "w") as f:
      json.dump(metrics, f)
    """)

def _glue(acc, base=0.5, **more):
  return {"eval_accuracy": acc, "eval_majority_baseline_accuracy": base,
          **more}


def _timed(metrics, wall, devices=1):
  return {**metrics, "goodput": {"wall_seconds": wall}, "devices": devices}


# task → three seeds' final_metrics.json values (before time).
SYNTHETIC = {
    "cola": [_glue(0.70, 0.69, eval_mcc=0.30), _glue(0.69, 0.69, eval_mcc=0.0),
             _glue(0.80, 0.69, eval_mcc=0.50)],
    "sst2": [_glue(0.90), _glue(0.92), _glue(0.91)],
    "mrpc": [_glue(0.80, 0.68, eval_f1=0.86), _glue(0.70, 0.68, eval_f1=0.80),
             _glue(0.84, 0.68, eval_f1=0.88)],
    "qqp": [_glue(0.90, 0.63, eval_f1=0.87), _glue(0.89, 0.63, eval_f1=0.86),
            _glue(0.91, 0.63, eval_f1=0.88)],
    "stsb": [{"eval_pearson": 0.88, "eval_spearman": 0.87},
             {"eval_pearson": -0.01, "eval_spearman": 0.02},
             {"eval_pearson": 0.90, "eval_spearman": 0.89}],
    "mnli": [{"eval_validation_matched/accuracy": m,
              "eval_validation_mismatched/accuracy": mm,
              "eval_validation_matched/majority_baseline_accuracy": 0.35}
             for m, mm in ((0.84, 0.85), (0.86, 0.85), (0.35, 0.33))],
    "qnli": [_glue(0.91), _glue(0.92), _glue(0.50)],
    "rte": [_glue(0.70), _glue(0.75), _glue(0.72)],
    "wnli": [_glue(0.56, 0.56), _glue(0.56, 0.56), _glue(0.44, 0.56)],
    "squad1.1": [{"eval_exact_match": 80.0, "eval_f1": 88.0},
                 {"eval_exact_match": 82.0, "eval_f1": 89.0},
                 {"eval_exact_match": 0.0, "eval_f1": 0.0}],
    "squad2.0": [{"eval_exact": 78.0, "eval_f1": 81.0, "eval_NoAns_total": 50,
                  "eval_total": 100},
                 {"eval_exact": 50.0, "eval_f1": 50.0, "eval_NoAns_total": 50,
                  "eval_total": 100},
                 {"eval_exact": 80.0, "eval_f1": 83.0, "eval_NoAns_total": 50,
                  "eval_total": 100}],
    "race": [{"eval_accuracy": a, "eval_test/accuracy": b}
             for a, b in ((0.80, 0.79), (0.25, 0.26), (0.81, 0.80))],
}


def _synthetic_metrics():
  """name/seed=K → final_metrics.json, seed K at K × 10 + 100 seconds on
  K + 1 devices."""
  return {f"{task}/seed={k}": _timed(m, 100 + 10 * k, k + 1)
          for task, runs in SYNTHETIC.items() for k, m in enumerate(runs)}


################################################################################
# The report's arithmetic, on every task.
################################################################################


def test_report_by_hand_for_every_task():
  names = downstream.parse_suite("glue,squad,race")
  assert names == [*downstream.GLUE, "squad1.1", "squad2.0", "race"]
  metrics = _synthetic_metrics()
  report = downstream.build_report(names, 3, metrics,
                                   {n: "ok" for n in metrics})
  t = report["tasks"]
  # CoLA: MCC ×100, median of 30, 0, 50; seed 1 sits at the baseline.
  assert t["cola"]["metrics"]["MCC"] == {"median": 30.0, "min": 0.0,
                                         "max": 50.0}
  assert t["cola"]["diverged"] == [1] and t["cola"]["median_seed"] == 0
  # MRPC: F1 and accuracy; the score is their mean per seed, then the median.
  assert t["mrpc"]["metrics"]["F1"] == pytest.approx(
      {"median": 86.0, "min": 80.0, "max": 88.0})
  assert t["mrpc"]["metrics"]["acc"] == pytest.approx(
      {"median": 80.0, "min": 70.0, "max": 84.0})
  assert t["mrpc"]["score"] == pytest.approx(83.0)  # (86 + 80) / 2
  assert t["mrpc"]["diverged"] == []
  # STS-B: Pearson -0.01 is a diverged seed, kept in the statistics.
  assert t["stsb"]["metrics"]["Pearson"] == pytest.approx(
      {"median": 88.0, "min": -1.0, "max": 90.0})
  assert t["stsb"]["score"] == pytest.approx(87.5)
  assert t["stsb"]["diverged"] == [1]
  # MNLI: m and mm; seed 2 is at the matched majority baseline or below.
  assert t["mnli"]["metrics"]["m"]["median"] == pytest.approx(84.0)
  assert t["mnli"]["metrics"]["mm"]["median"] == pytest.approx(85.0)
  assert t["mnli"]["score"] == pytest.approx(84.5)
  assert t["mnli"]["diverged"] == [2]
  assert t["qnli"]["diverged"] == [2] and t["wnli"]["diverged"] == [0, 1, 2]
  # SQuAD in percent as it is; v1.1's F1 0 and v2.0's 50 of 50% no-answer.
  assert t["squad1.1"]["metrics"]["EM"] == {"median": 80.0, "min": 0.0,
                                            "max": 82.0}
  assert t["squad1.1"]["score"] == pytest.approx(84.0)  # (80 + 88) / 2
  assert t["squad1.1"]["diverged"] == [2]
  assert t["squad2.0"]["diverged"] == [1]
  assert t["squad2.0"]["score"] == pytest.approx(79.5)
  # RACE: dev accuracy scores, test accuracy beside it; chance diverges.
  assert t["race"]["metrics"]["acc"] == pytest.approx(
      {"median": 80.0, "min": 25.0, "max": 81.0})
  assert t["race"]["metrics"]["test acc"]["median"] == pytest.approx(79.0)
  assert t["race"]["score"] == pytest.approx(80.0)
  assert t["race"]["diverged"] == [1] and t["race"]["median_seed"] == 0
  # GLUE score: the mean of the nine median task scores.
  medians = {"cola": 30.0, "sst2": 91.0, "mrpc": 83.0, "qqp": 88.5,
             "stsb": 87.5, "mnli": 84.5, "qnli": 91.0, "rte": 72.0,
             "wnli": 56.0}
  for name, value in medians.items():
    assert t[name]["score"] == pytest.approx(value), name
  assert report["glue"]["score"] == pytest.approx(
      sum(medians.values()) / 9)
  assert not report["glue"]["partial"]
  # Time: 100 + 110 + 120 s per task; devices 1, 2, 3.
  for e in t.values():
    assert e["wall_seconds"] == pytest.approx(330)
    assert e["device_hours"] == pytest.approx((100 + 220 + 360) / 3600)
  assert report["device_hours"] == pytest.approx(12 * 680 / 3600)
  text = downstream.markdown(report, "# r")
  assert ("| mrpc | F1 86.00 (80.00–88.00); acc 80.00 (70.00–84.00) | "
          "83.00 | 3/3 | 0 | 0 | 330 | 0.189 |") in text
  assert "| stsb |" in text and "| 1 (seed 1) |" in text
  assert f"**{sum(medians.values()) / 9:.2f}**" in text


def test_median_seed_and_partial_glue_score():
  # Lower median of an even count; a tie goes to the lower seed.
  assert downstream.median_seed({0: 0.7, 1: 0.5, 2: 0.9, 3: 0.6}) == 3
  assert downstream.median_seed({0: 0.7, 1: 0.7, 2: 0.7}) == 1
  assert downstream.median_seed({4: 0.1}) == 4
  metrics = _synthetic_metrics()
  report = downstream.build_report(["rte", "mrpc", "race"], 2, metrics,
                                   {"rte/seed=1": "failed"})
  # Two seeds: the median is the mean of both; RACE is not GLUE.
  assert report["tasks"]["rte"]["score"] == pytest.approx(72.5)
  assert report["tasks"]["rte"]["median_seed"] == 0
  assert report["tasks"]["rte"]["failed"] == [1]
  assert report["glue"] == {"score": pytest.approx((72.5 + 79.0) / 2),
                            "tasks": ["mrpc", "rte"], "partial": True}
  # A missing trial is left out of the statistics and shown as not done.
  del metrics["rte/seed=1"]
  report = downstream.build_report(["rte"], 2, metrics, {})
  assert report["tasks"]["rte"]["finished"] == [0]
  assert report["tasks"]["rte"]["score"] == pytest.approx(70.0)
  assert "| 1/2 |" in downstream.markdown(report, "")


def test_presets():
  rte = downstream.TASKS["rte"]
  assert downstream.trial_overrides(rte, "paper") == {}
  sane = downstream.trial_overrides(rte, "sane")
  # 5 epochs of RTE's 2490 examples at batch 16; 10% warmup.
  assert sane["num_train_steps"] == 779 and sane["batch_size"] == 16
  assert sane["optimizer.warmup_steps"] == 78
  assert sane["eval_every_steps"] == 155
  assert sane["optimizer.learning_rate"] == 4e-5
  assert sane["optimizer.schedule"] == "cosine"
  mnli = downstream.trial_overrides(downstream.TASKS["mnli"], "sane")
  assert {k: v for k, v in mnli.items() if "steps" not in k} == {
      k: v for k, v in sane.items() if "steps" not in k}
  assert downstream.trial_overrides(downstream.TASKS["race"], "sane") == {}


################################################################################
# The command with a fake trainer.
################################################################################


@pytest.fixture(name="env")
def fixture_env(tmp_path, monkeypatch):
  """A fake trainer, its metrics file and a model directory."""
  monkeypatch.chdir(REPO)
  fake = tmp_path / "fake_main.py"
  fake.write_text(FAKE_MAIN)
  metrics = tmp_path / "metrics.json"
  metrics.write_text(json.dumps(_synthetic_metrics()))
  monkeypatch.setenv("FAKE_METRICS", str(metrics))
  model = tmp_path / "model"
  model.mkdir()
  return dict(fake=str(fake), model=str(model), root=tmp_path / "runs")


def _calls(root):
  path = root / "calls.txt"
  return ([json.loads(l) for l in path.read_text().splitlines()]
          if path.exists() else [])


def _argv(env, *more):
  return [env["model"], f"--workdir_root={env['root']}",
          f"--main_module={env['fake']}", *more]


def test_bad_input_is_one_error_line(env, capsys, monkeypatch):
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  for argv, message in (
      (_argv(env, "--suite=mrcp"), "error: unknown task 'mrcp' in --suite "
       "(did you mean 'mrpc'?); give a suite (glue, squad, race, bundled) or "
       "task names "
       "from cola, "),
      (_argv(env, "--seeds=0"), "error: --seeds=0; give 1 or more, e.g. "
       "--seeds=5"),
      ([env["model"] + "_gone", "--workdir_root=/tmp/x"],
       f"error: model {env['model']}_gone does not exist or is not a "
       "directory; give an albert_jax pre-training workdir, or an HF or TF "
       "checkpoint directory."),
      (_argv(env, "--suite=rte", "--", "--config.optimizer.lr=1"),
       "error: Unknown config key 'optimizer.lr'"),
      (_argv(env, "--devices_per_trial=3", "--platform=gpu",
             "--num_devices=8"), "error: --devices_per_trial=3 does not "
       "divide the 8 GPUs here: 2 would sit idle; give one of 1, 2, 4, 8, or "
       "--num_devices=6 to leave 2 idle.\n"),
      (_argv(env, "--devices_per_trial=4", "--parallel=3", "--platform=gpu",
             "--num_devices=8"), "error: --parallel=3 is more than the 2 "
       "groups of 4 of 8 GPUs (--devices_per_trial=4); give --parallel=2 or "
       "less, one trial per group at a time.\n")):
    assert downstream.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert err.count("\n") == 1, err


def test_print_commands_give_table_14_or_the_sane_preset(env, capsys):
  assert downstream.main(_argv(env, "--suite=rte,squad1.1", "--seeds=2",
                               "--print_commands")) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 4
  configs = "configs"  # from the repository root, as on a slice's workers
  assert lines[1].split()[2:] == [
      f"--config={configs}/glue.py:task=rte",
      f"--workdir={env['root']}/rte/seed=1",
      f"--config.init={env['model']}", "--config.seed=1"]
  assert f"--config={configs}/squad.py:version=1.1" in lines[2]
  assert downstream.main(_argv(env, "--suite=rte", "--seeds=1", "--preset=sane",
                               "--print_commands")) == 0
  line = capsys.readouterr().out
  assert "--config.num_train_steps=779 --config.optimizer.warmup_steps=78" \
      in line and "--config.optimizer.schedule=cosine" in line
  # On a TPU slice: every trial through tpu_setup.sh on all workers.
  assert downstream.main(_argv(env, "--suite=rte", "--seeds=1",
                               "--print_commands", "--launcher=tpu")) == 0
  assert capsys.readouterr().out.startswith(
      "bash tpu_setup.sh run --name=$TPU_NAME --zone=$ZONE -- "
      f"--config={configs}/glue.py:task=rte --workdir={env['root']}/rte/")


def test_suite_runs_in_parallel_and_writes_report_and_submission(
    env, capsys, monkeypatch):
  monkeypatch.setenv("FAKE_SLEEP", "0.5")
  argv = _argv(env, "--suite=rte,stsb,mnli", "--seeds=3", "--parallel=3")
  assert downstream.main(argv) == 0
  out = capsys.readouterr().out
  root = env["root"]
  calls = _calls(root)
  assert sorted(c[0] for c in calls) == sorted(
      f"{t}/seed={k}" for t in ("rte", "stsb", "mnli") for k in range(3))
  starts = sorted(c[1] for c in calls)
  assert starts[2] - starts[0] < 0.5  # three started before any ended
  report = json.loads((root / "report.json").read_text())
  assert report["tasks"]["rte"]["score"] == pytest.approx(72.0)
  assert report["glue"]["tasks"] == ["mnli", "rte", "stsb"]
  assert (root / "report.md").read_text() in out
  # Submission: each task's median seed's files, parsed back. RTE's median
  # is seed 2 (0.72), STS-B's seed 0 (0.875), MNLI's seed 0 (0.845).
  sub = root / "submission"
  assert sorted(os.listdir(sub)) == ["MNLI-m.tsv", "MNLI-mm.tsv", "RTE.tsv",
                                     "STS-B.tsv"]
  def rows(file):
    with open(sub / file, newline="", encoding="utf-8") as f:
      return list(csv.reader(f, delimiter="\t"))
  assert rows("RTE.tsv") == [["index", "prediction"]] + [
      [str(i), "entailment"] for i in range(3)]
  assert rows("STS-B.tsv")[1] == ["0", "0.000000"]
  assert rows("MNLI-mm.tsv")[2] == ["1", "entailment"]
  # A rerun finds everything done and runs nothing.
  assert downstream.main(argv) == 0
  assert len(_calls(root)) == 9
  assert capsys.readouterr().out.count("done, skipped") == 9
  # Other arguments for done trials are refused, naming the difference.
  assert downstream.main(argv + ["--", "--config.batch_size=8"]) == 2
  assert "now --config.batch_size=8" in capsys.readouterr().err


def test_seeds_run_one_per_device_group(env, capsys, monkeypatch):
  """2 GPUs, 1 a trial: three seeds, two at once, each log naming its GPU."""
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  monkeypatch.setenv("FAKE_SLEEP", "0.3")
  assert downstream.main(_argv(env, "--suite=rte", "--seeds=3",
                               "--devices_per_trial=1", "--platform=gpu",
                               "--num_devices=2")) == 0
  assert capsys.readouterr().out.count(": running on GPU ") == 3
  root = env["root"]
  firsts = sorted((root / "rte" / f"seed={k}" / "sweep.log").read_text()
                  .splitlines()[0] for k in range(3))
  assert firsts in ([f"devices: GPU {a}; CUDA_VISIBLE_DEVICES={a}"
                     for a in ids] for ids in ("001", "011"))
  starts = sorted(c[1] for c in _calls(root))
  assert starts[1] - starts[0] < 0.3  # --parallel defaulted to the 2 groups
  assert json.loads((root / "report.json").read_text())[
      "tasks"]["rte"]["finished"] == [0, 1, 2]


def test_a_killed_suite_resumes_with_only_the_killed_trial(env):
  """The command is killed (its whole process group, as a preempted host
  goes) while rte/seed=1 runs; the rerun runs only that trial."""
  argv = [sys.executable, "-m", "albert_jax.tools.downstream",
          *_argv(env, "--suite=rte,mrpc", "--seeds=2")]
  hang = env["root"] / "rte" / "seed=1" / "hanging"
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
      argv, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      env={**os.environ, "FAKE_HANG": "rte/seed=1",
           "PYTHONPATH": str(REPO)})
  deadline = time.monotonic() + 60
  while not hang.exists():
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.05)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  assert not (env["root"] / "report.json").exists()
  assert [c[0] for c in _calls(env["root"])] == ["rte/seed=0", "rte/seed=1"]
  # The killed command's claim on its trial is left; its process is gone,
  # so the rerun takes it over at once rather than when it goes stale.
  claim = env["root"] / "rte" / "seed=1" / sweep.CLAIM
  assert json.loads(claim.read_text())["pid"] == proc.pid
  result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)},
                          check=False)
  assert result.returncode == 0, result.stderr
  assert (f"Taking over {claim} from pid {proc.pid} on " in result.stderr
          and "its process is gone" in result.stderr), result.stderr
  assert not claim.exists()
  assert [c[0] for c in _calls(env["root"])] == [
      "rte/seed=0", "rte/seed=1", "rte/seed=1", "mrpc/seed=0", "mrpc/seed=1"]
  assert "rte/seed=0: done, skipped" in result.stdout
  report = json.loads((env["root"] / "report.json").read_text())
  assert report["tasks"]["rte"]["finished"] == [0, 1]


def test_two_processes_write_whole_reports(env, tmp_path):
  """The suite run by two processes at once on one root, as on two hosts
  of a slice: each trial runs once, and each process writes the report
  only when every trial is done, whichever ran it: both are whole."""
  argv = _argv(env, "--suite=rte,stsb", "--seeds=2")
  ran = start_together(tmp_path, "downstream", argv, FAKE_SLEEP="0.2")
  assert [rc for rc, _, _ in ran] == [0, 0], ran
  assert sorted(c[0] for c in _calls(env["root"])) == [
      "rte/seed=0", "rte/seed=1", "stsb/seed=0", "stsb/seed=1"]
  report = json.loads((env["root"] / "report.json").read_text())
  assert {name: task["finished"] for name, task in report["tasks"].items()
          } == {"rte": [0, 1], "stsb": [0, 1]}
  for _, out, _ in ran:
    assert out.count(" | 2/2 | ") == 2, out


def test_the_bundled_suite_is_the_demos_fine_tune_over_seeds():
  """`--suite=bundled`: the demo's two labelled tasks, each trial the demo's
  fine-tune (configs/bundled.py) from MODEL with the trial's seed; dev
  accuracy scores, test accuracy beside it, the majority class diverges."""
  from albert_jax.tools import sweep  # pylint: disable=g-import-not-at-top
  load = sweep._base_config  # pylint: disable=protected-access
  assert downstream.parse_suite("bundled") == ["source", "spam"]
  planned = downstream.trials("/m", ["source", "spam"], 2, "paper")
  config, overrides = planned["spam/seed=1"]
  assert overrides == {"init": "/m", "seed": 1}
  # The trial's config is the demo's fine-tune, but for the demo's own
  # extras (new texts to predict, the random-init rerun).
  demo = load(str(REPO / "configs" / "demo.py:task=spam")).finetune
  del demo.predict_texts, demo.compare_random_init
  assert load(config).to_dict() == demo.to_dict()
  runs = {f"spam/seed={k}": _timed(
      {"eval_accuracy": a, "eval_majority_baseline_accuracy": 0.85,
       "eval_test/accuracy": b}, 60) for k, (a, b) in enumerate(
           ((0.95, 0.94), (0.85, 0.86), (0.97, 0.96)))}
  report = downstream.build_report(["spam"], 3, runs,
                                   {n: "ok" for n in runs})
  t = report["tasks"]["spam"]
  assert t["metrics"]["acc"] == pytest.approx(
      {"median": 95.0, "min": 85.0, "max": 97.0})
  assert t["metrics"]["test acc"]["median"] == pytest.approx(94.0)
  assert t["score"] == pytest.approx(95.0)
  assert t["diverged"] == [1] and t["median_seed"] == 0
  assert report["glue"] is None
