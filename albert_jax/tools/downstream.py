r"""The paper's downstream evaluation of a pre-trained model in one command.

Fine-tunes MODEL on every task of a suite, `--seeds` times each (seeds
0..N-1), with the ALBERT paper's Table 14 settings (configs/glue.py,
configs/squad.py, configs/race.py), and reports the median, min and max of
each task's dev metrics over the seeds, as the paper reports the median of
five runs:

  python -m albert_jax.tools.downstream /path/to/albert-base-v2 \
      --suite=glue --workdir_root=/tmp/glue_eval --parallel=2
  python -m albert_jax.tools.downstream gs://b/pretrain \
      --suite=rte,mrpc,squad --seeds=3 --workdir_root=gs://b/eval \
      -- --config.data.tfds_data_dir=gs://b/tfds

MODEL is anything `--config.init` takes (an albert_jax pre-training workdir,
an HF or official TF checkpoint directory). `--suite` is `glue` (its nine
tasks), `squad` (v1.1 and v2.0), `race`, `bundled` (the demo's two bundled
labelled tasks, configs/bundled.py: no download, a minute a trial on CPU at
the demo's size), or a comma list of those and of task names (cola, sst2,
mrpc, qqp, stsb, mnli, qnli, rte, wnli, squad1.1, squad2.0, race, source,
spam). Arguments after `--` go to every trial
(`--config.optimizer.layerwise_lr_decay=0.8`, `--config.data.tfds_data_dir=`).

`--preset=sane` replaces Table 14's per-task GLUE settings by one set for
every GLUE task, cramming's "GLUE-sane" (Geiping & Goldstein 2023,
eval/GLUE_sane.yaml): AdamW at 4e-5 (β2 0.98, no weight decay), batch 16,
length 128, 5 epochs of the task's training set, 10% warmup then a cosine
decay; encoder dropout 0.1 (ours: cramming leaves it to the model). SQuAD
and RACE keep Table 14, at most 5 epochs already.

Trials run through the sweep's machinery (`albert_jax.tools.sweep`): each in
WORKDIR_ROOT/TASK/seed=K, `--parallel` at a time; a trial with a
final_metrics.json is done and skipped, so a rerun after a kill or a failure
runs only what is missing (a killed trial resumes from its checkpoints),
and a rerun with other arguments for a done trial is refused.
`--devices_per_trial=K` runs each trial on K devices of its own, the
host's GPUs or TPU chips split into groups, one trial per group at a time
(`--parallel` defaults to the number of groups; see
albert_jax/tools/device_groups.py); each trial's log starts with the
devices it ran on.

The report (WORKDIR_ROOT/report.md and report.json, printed at the end):
  * per task, the metrics the paper reports: MNLI-m/mm accuracy, QQP and
    MRPC F1/accuracy, STS-B Pearson/Spearman, CoLA Matthews correlation,
    SST-2, QNLI, RTE, WNLI and RACE accuracy (RACE's test accuracy too,
    the paper's number; dev scores it), SQuAD EM/F1 (dev); GLUE's in
    percent, as the paper prints them; median, min and max over the seeds
    (the median of an even count is the mean of the middle two);
  * the GLUE score by the GLUE benchmark's convention (Wang et al. 2018,
    the leaderboard's macro-average): a task's score is the unweighted mean
    of its metrics (MRPC and QQP: F1 and accuracy; STS-B: Pearson and
    Spearman; MNLI: matched and mismatched accuracy, MNLI counting once),
    the score the mean over the tasks of their median scores. With fewer
    than the nine tasks it is the mean over those run, marked partial;
  * diverged seeds, counted and kept in every statistic: a classification
    trial whose accuracy is at or below the majority-class baseline on the
    dev set (final_metrics.json's majority_baseline_accuracy, the share of
    the training set's commonest label; RACE: chance, 25%), an STS-B trial
    with Pearson <= 0 (a constant prediction's), a SQuAD trial with F1 at
    or below answering nothing (0 on v1.1; the unanswerable share on v2.0);
  * time: each trial's wall seconds as its trainer booked them (goodput,
    every session of a resumed trial; start-up to the last step, the
    process's import time and the final prediction files not included), and
    device-hours (those seconds × the devices the trial ran on), per task
    and in total, with this command's own wall time.

On a multi-host TPU slice the hosts run trials at once: the same command
on every worker, WORKDIR_ROOT in gs://, `--devices_per_trial` splitting
each host's chips (required there; the README gives the tpu_setup.sh ssh
line). Each process claims a trial before it runs it (the sweep's claims,
WORKDIR_ROOT/TASK/seed=K/claim.json, albert_jax/tools/sweep.py), so every
trial runs once; one that fails is reported failed by every process of the
run, and a later run of the command retries it. Each process writes the
report (and submission/) only once every trial is done or failed,
whichever host ran it: every copy is whole, the last written stands, and
they differ only in this command's own wall time. A model too big for one
host runs each trial on the whole slice, one after another:
`--print_commands --launcher=tpu > suite.sh && bash suite.sh` runs them
with tpu_setup.sh; the same command without --print_commands then finds
them done and writes the report.

Submission (WORKDIR_ROOT/submission): for each GLUE task, the test-set
files of its median seed (GLUE's file names: CoLA.tsv, MNLI-m.tsv, ...,
`index<TAB>prediction`), ready to zip for gluebenchmark.com (which also
wants AX.tsv: `-- --config.data.glue_ax=true` writes it with MNLI's). The
median seed is the lower median of the seeds ordered by task score, a tie
going to the lower seed: seed k of N sorted is number (N - 1) // 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Mapping, Sequence

from albert_jax import hints
from albert_jax import storage
from albert_jax.tools import device_groups
from albert_jax.tools import sweep

# configs/ sits beside the package in the repository.
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "configs")


@dataclasses.dataclass(frozen=True)
class Task:
  """One task of the report.

  Attributes:
    name: as `--suite` names it ("mnli").
    config: the config file and its argument ("glue.py:task=mnli").
    metrics: (label, final_metrics.json key) of each metric reported.
    scale: the factor a metric is shown at (100: GLUE's fractions in
      percent; SQuAD's are percent already).
    baseline: (metric key, baseline key or value): diverged where the
      metric is at or below the baseline; None where another rule applies.
    scored: how many of `metrics`, from the first, make the task's score
      (their mean); 0: all.
    files: the GLUE submission files its runs write ({} elsewhere).
    train_size: training examples (the sane preset's epochs); 0: none.
  """
  name: str
  config: str
  metrics: tuple[tuple[str, str], ...]
  scale: float = 100.0
  baseline: tuple[str, str | float] | None = None
  files: tuple[str, ...] = ()
  train_size: int = 0
  scored: int = 0

  @property
  def score_keys(self) -> tuple[str, ...]:
    """The final_metrics.json keys averaged into the task's score."""
    return tuple(k for _, k in self.metrics[:self.scored or None])

  @property
  def glue(self) -> bool:
    return self.config.startswith("glue.py")


def _glue(name, metrics, file, size, split="", files=None):
  acc, base = f"eval_{split}accuracy", f"eval_{split}majority_baseline_accuracy"
  return Task(name, f"glue.py:task={name}", metrics, 100.0, (acc, base),
              files or (file,), size)


_ACC = (("acc", "eval_accuracy"),)
# Training-set sizes of TFDS's glue (GLUE's own splits).
TASKS: dict[str, Task] = {t.name: t for t in (
    _glue("cola", (("MCC", "eval_mcc"),), "CoLA.tsv", 8551),
    _glue("sst2", _ACC, "SST-2.tsv", 67349),
    _glue("mrpc", (("F1", "eval_f1"), ("acc", "eval_accuracy")),
          "MRPC.tsv", 3668),
    _glue("qqp", (("F1", "eval_f1"), ("acc", "eval_accuracy")),
          "QQP.tsv", 363846),
    Task("stsb", "glue.py:task=stsb", (("Pearson", "eval_pearson"),
                                       ("Spearman", "eval_spearman")),
         100.0, None, ("STS-B.tsv",), 5749),
    _glue("mnli", (("m", "eval_validation_matched/accuracy"),
                   ("mm", "eval_validation_mismatched/accuracy")), None,
          392702, split="validation_matched/",
          files=("MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv")),
    _glue("qnli", _ACC, "QNLI.tsv", 104743),
    _glue("rte", _ACC, "RTE.tsv", 2490),
    _glue("wnli", _ACC, "WNLI.tsv", 635),
    Task("squad1.1", "squad.py:version=1.1",
         (("EM", "eval_exact_match"), ("F1", "eval_f1")), 1.0),
    Task("squad2.0", "squad.py:version=2.0",
         (("EM", "eval_exact"), ("F1", "eval_f1")), 1.0),
    # RACE: dev accuracy scores (the checkpoint was chosen on it); the test
    # accuracy, the paper's Table 13 number, is shown beside it. Four
    # options: chance is the baseline (no majority is recorded for it).
    Task("race", "race.py:subset=all",
         (("acc", "eval_accuracy"), ("test acc", "eval_test/accuracy")),
         100.0, ("eval_accuracy", 0.25), scored=1),
    # The bundled labelled tasks (configs/bundled.py), the demo's: dev
    # accuracy scores, as RACE's; test accuracy, what the demo prints, beside.
    *(Task(name, f"bundled.py:task={name}",
           (("acc", "eval_accuracy"), ("test acc", "eval_test/accuracy")),
           100.0, ("eval_accuracy", "eval_majority_baseline_accuracy"),
           scored=1) for name in ("source", "spam")),
)}
GLUE = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")
SUITES = {"glue": GLUE, "squad": ("squad1.1", "squad2.0"), "race": ("race",),
          "bundled": ("source", "spam")}
PRESETS = ("paper", "sane")
# cramming's GLUE_sane.yaml (with its optim/adam.yaml): one set for all.
SANE_EPOCHS, SANE_BATCH, SANE_WARMUP = 5, 16, 0.1
SANE = {"optimizer.name": "adamw", "optimizer.learning_rate": 4e-5,
        "optimizer.b2": 0.98, "optimizer.eps": 1e-6,
        "optimizer.weight_decay": 0.0, "optimizer.schedule": "cosine",
        "batch_size": SANE_BATCH, "data.max_seq_length": 128,
        "model.hidden_dropout_prob": 0.1,
        "model.attention_probs_dropout_prob": 0.1}


class DownstreamError(ValueError):
  """Input the command cannot run: one line naming it and the fix."""


def parse_suite(suite: str) -> list[str]:
  """Task names, in suite order, from "glue,squad1.1,race" and the like."""
  names = []
  for item in (s.strip().lower() for s in suite.split(",")):
    if not item:
      continue
    if item in SUITES:
      names += SUITES[item]
    elif item in TASKS:
      names.append(item)
    else:
      known = [*SUITES, *TASKS]
      raise DownstreamError(
          f"unknown task {item!r} in --suite"
          f"{hints.did_you_mean(item, known, n=2)}; give a suite ({', '.join(SUITES)}) or task names from "
          f"{', '.join(TASKS)}, e.g. --suite=glue or --suite=rte,mrpc.")
  if not names:
    raise DownstreamError("--suite names no task; give e.g. --suite=glue.")
  return list(dict.fromkeys(names))


def trial_overrides(task: Task, preset: str) -> dict[str, Any]:
  """A task's overrides of its Table 14 config under `preset`."""
  if preset == "paper" or not task.glue:
    return {}
  steps = math.ceil(SANE_EPOCHS * task.train_size / SANE_BATCH)
  return {**SANE, "num_train_steps": steps,
          "optimizer.warmup_steps": math.ceil(SANE_WARMUP * steps),
          # Once an epoch, keeping the best, as Table 14's configs do.
          "eval_every_steps": steps // SANE_EPOCHS,
          "checkpoint_every_steps": steps // SANE_EPOCHS}


def _config_dir() -> str:
  """configs/ as a trial's command names it: relative from the repository
  root, as on a TPU slice's workers, whose copy lives elsewhere; else the
  absolute path."""
  here = os.path.join(os.getcwd(), "configs")
  same = os.path.isdir(here) and os.path.samefile(here, CONFIGS)
  return "configs" if same else CONFIGS


def trials(model: str, names: Sequence[str], seeds: int, preset: str
           ) -> dict[str, tuple[str, dict[str, Any]]]:
  """name ("rte/seed=0") → (config spec, overrides) of every trial."""
  out = {}
  configs = _config_dir()
  for name in names:
    task = TASKS[name]
    config = os.path.join(configs, task.config)
    for seed in range(seeds):
      out[f"{name}/seed={seed}"] = (config, {
          "init": model, "seed": seed, **trial_overrides(task, preset)})
  return out


################################################################################
# The report.
################################################################################


def _score(task: Task, metrics: Mapping[str, Any]) -> float | None:
  """The task's score of one trial: the mean of its metrics, scaled."""
  values = [metrics.get(key) for key in task.score_keys]
  if any(not isinstance(v, (int, float)) for v in values):
    return None
  return task.scale * sum(values) / len(values)


def diverged(task: Task, metrics: Mapping[str, Any]) -> bool | None:
  """Whether a finished trial did no better than a trivial predictor (see
  the module docstring); None where its metrics hold no baseline."""
  if task.baseline is not None:
    key, base = task.baseline
    value = metrics.get(key)
    base = metrics.get(base) if isinstance(base, str) else base
    return None if value is None or base is None else value <= base
  if task.name == "stsb":
    pearson = metrics.get("eval_pearson")
    return None if pearson is None else not pearson > 0  # NaN diverged too
  f1 = metrics.get("eval_f1")
  if f1 is None:
    return None
  no_answer = metrics.get("eval_NoAns_total")
  total = metrics.get("eval_total")
  floor = 100.0 * no_answer / total if no_answer is not None and total else 0.0
  return f1 <= floor


def median_seed(scores: Mapping[int, float]) -> int:
  """The lower-median seed: ordered by (score, seed), number (N - 1) // 2."""
  ordered = sorted(scores, key=lambda s: (scores[s], s))
  return ordered[(len(ordered) - 1) // 2]


def _stats(values: Sequence[float]) -> dict[str, float]:
  return {"median": statistics.median(values), "min": min(values),
          "max": max(values)}


def task_report(task: Task, runs: Mapping[int, Mapping[str, Any] | None]
                ) -> dict[str, Any]:
  """One task's entry: per metric median/min/max over the finished seeds,
  the median score, the diverged seeds, the median seed, and time."""
  done = {s: m for s, m in runs.items() if m is not None}
  scores = {s: _score(task, m) for s, m in done.items()}
  scored = {s: v for s, v in scores.items() if v is not None}
  entry = {"task": task.name, "seeds": sorted(runs),
           "finished": sorted(done), "metrics": {}, "scores": scored}
  for label, key in task.metrics:
    values = [task.scale * m[key] for m in done.values()
              if isinstance(m.get(key), (int, float))]
    entry["metrics"][label] = _stats(values) if values else None
  entry["score"] = statistics.median(scored.values()) if scored else None
  entry["median_seed"] = median_seed(scored) if scored else None
  flags = {s: diverged(task, m) for s, m in done.items()}
  entry["diverged"] = sorted(s for s, d in flags.items() if d)
  entry["wall_seconds"] = sum(_wall(m) for m in done.values())
  entry["device_hours"] = sum(_wall(m) * _devices(m)
                              for m in done.values()) / 3600
  return entry


def _wall(metrics: Mapping[str, Any]) -> float:
  return float((metrics.get("goodput") or {}).get("wall_seconds", 0.0))


def _devices(metrics: Mapping[str, Any]) -> int:
  return int(metrics.get("devices", 1))


def glue_score(entries: Mapping[str, Mapping[str, Any]]
               ) -> dict[str, Any] | None:
  """The GLUE macro-average of the tasks' median scores (None: no GLUE
  task has one)."""
  scores = {n: e["score"] for n, e in entries.items()
            if TASKS[n].glue and e["score"] is not None}
  if not scores:
    return None
  return {"score": sum(scores.values()) / len(scores), "tasks": sorted(scores),
          "partial": len(scores) < len(GLUE)}


def build_report(names: Sequence[str], seeds: int,
                 metrics: Mapping[str, Mapping[str, Any] | None],
                 status: Mapping[str, str]) -> dict[str, Any]:
  """The whole report, as report.json holds it."""
  entries = {}
  for name in names:
    runs = {s: metrics.get(f"{name}/seed={s}") for s in range(seeds)}
    entries[name] = task_report(TASKS[name], runs)
    entries[name]["failed"] = [s for s in range(seeds)
                               if status.get(f"{name}/seed={s}") == "failed"]
  return {"tasks": entries, "glue": glue_score(entries),
          "wall_seconds": sum(e["wall_seconds"] for e in entries.values()),
          "device_hours": sum(e["device_hours"] for e in entries.values())}


def _cell(stats) -> str:
  if stats is None:
    return "–"
  return (f"{stats['median']:.2f} ({stats['min']:.2f}–{stats['max']:.2f})")


def markdown(report: Mapping[str, Any], header: str) -> str:
  """The report as a markdown table, one row per task."""
  rows = ["| task | metric: median (min–max) | score | seeds done | "
          "diverged | failed | wall s | device-h |", "|" + "---|" * 8]
  for name, e in report["tasks"].items():
    metrics = "; ".join(f"{label} {_cell(stats)}"
                        for label, stats in e["metrics"].items())
    score = "–" if e["score"] is None else f"{e['score']:.2f}"
    rows.append(
        f"| {name} | {metrics} | {score} | {len(e['finished'])}/"
        f"{len(e['seeds'])} | {len(e['diverged'])}"
        + (f" (seed {', '.join(map(str, e['diverged']))})"
           if e["diverged"] else "")
        + f" | {len(e['failed'])} | {e['wall_seconds']:.0f} | "
        f"{e['device_hours']:.3f} |")
  lines = [header, "", *rows, ""]
  glue = report["glue"]
  if glue is not None:
    lines.append(f"GLUE score (macro-average of task scores): "
                 f"**{glue['score']:.2f}**"
                 + (f" — partial, {len(glue['tasks'])} of {len(GLUE)} "
                    f"tasks ({', '.join(glue['tasks'])})"
                    if glue["partial"] else ""))
  lines.append(f"Total: {report['wall_seconds']:.0f} trial wall seconds, "
               f"{report['device_hours']:.3f} device-hours"
               + (f"; this command ran {report['command_seconds']:.0f} s."
                  if "command_seconds" in report else "."))
  return "\n".join(lines) + "\n"


def collect_submission(report: Mapping[str, Any], root: str,
                       out: str) -> list[str]:
  """Copies each GLUE task's median-seed test files into `out`; the names
  copied. A file the run did not write (AX.tsv without glue_ax) is skipped."""
  copied = []
  for name, e in report["tasks"].items():
    task = TASKS[name]
    if not task.glue or e["median_seed"] is None:
      continue
    src = storage.path(root) / name / f"seed={e['median_seed']}" / (
        "predictions")
    for file in task.files:
      if (src / file).exists():
        storage.path(out).mkdir(parents=True, exist_ok=True)
        storage.write_atomic(storage.path(out) / file,
                             (src / file).read_bytes())
        copied.append(file)
  return copied


################################################################################
# The command.
################################################################################


def _parse(argv):
  p = argparse.ArgumentParser(prog="python -m albert_jax.tools.downstream",
                              description=__doc__.split("\n")[0])
  add = p.add_argument
  add("model", help="The pre-trained model: an albert_jax workdir, an HF or "
      "TF checkpoint directory (what --config.init takes).")
  add("--suite", default="glue", help="glue, squad, race, or a comma list "
      "of those and task names (default glue).")
  add("--seeds", type=int, default=5, help="Runs per task, seeds 0..N-1 "
      "(default 5, as the paper's medians).")
  add("--workdir_root", required=True, help="Trials run in "
      "WORKDIR_ROOT/TASK/seed=K; the report and submission/ go here.")
  add("--preset", choices=PRESETS, default="paper", help="paper: Table 14 "
      "per task; sane: one GLUE set for all (see the module docstring).")
  add("--parallel", type=int, help="Trials at once (the sweep's "
      "--parallel: one process each; default 1, or with --devices_per_trial "
      "one per device group; without it 1/N of an accelerator's memory).")
  device_groups.add_flags(p)
  add("--main_module", default="albert_jax.main", help="Module run per "
      "trial, or a script path ending in .py.")
  add("--print_commands", action="store_true", help="Print one command per "
      "trial (done ones commented out); run nothing.")
  add("--launcher", choices=("local", "tpu"), default="local", help="With "
      "--print_commands: tpu runs each on all workers of a TPU slice via "
      "tpu_setup.sh; rerun without it for the report.")
  split = argv.index("--") if "--" in argv else len(argv)
  return p.parse_args(argv[:split]), argv[split + 1:]


def _check(args) -> list[str]:
  """The task names; DownstreamError for bad input."""
  if args.seeds < 1:
    raise DownstreamError(f"--seeds={args.seeds}; give 1 or more, e.g. "
                          "--seeds=5 (the paper's medians are of five).")
  if args.parallel is not None and args.parallel < 1:
    raise DownstreamError(f"--parallel={args.parallel}; give 1 (one trial "
                          "after another) or more.")
  names = parse_suite(args.suite)
  if not storage.path(args.model).is_dir():
    raise DownstreamError(
        f"model {args.model} does not exist or is not a directory; give an "
        "albert_jax pre-training workdir, or an HF or TF checkpoint "
        "directory.")
  return names


def main(argv: list[str] | None = None) -> int:
  started = time.time()
  args, extra = _parse(sys.argv[1:] if argv is None else argv)
  try:
    names = _check(args)
    parallel, devices = device_groups.plan(
        args.devices_per_trial, args.parallel, args.platform,
        args.num_devices, print_commands=args.print_commands)
  except (DownstreamError, device_groups.DeviceGroupError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  root = os.fspath(storage.path(args.workdir_root.rstrip("/") or "/"))
  model = storage.as_str(args.model)
  planned = trials(model, names, args.seeds, args.preset)
  try:
    for config in dict.fromkeys(c for c, _ in planned.values()):
      sweep.validate(config, {n: t for n, (c, t) in planned.items()
                              if c == config},
                     [a[len("--config."):].split("=", 1)[0]
                      for a in extra if a.startswith("--config.")])
    status, metrics = sweep.run_trials(
        planned, root, extra=extra, parallel=parallel,
        main_module=args.main_module, print_commands=args.print_commands,
        launcher=args.launcher, devices=devices)
  except sweep.SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.print_commands:
    return 0
  report = build_report(names, args.seeds, metrics, status)
  report["command_seconds"] = time.time() - started
  report.update(model=model, preset=args.preset, extra=extra)
  files = collect_submission(report, root, f"{root}/submission")
  report["submission"] = files
  text = markdown(report, f"# Downstream evaluation of `{model}`\n\n"
                  f"Preset {args.preset}, {args.seeds} seed(s) per task"
                  + (f", trial arguments `{' '.join(extra)}`" if extra else "")
                  + f"; trials under `{root}/`.")
  if files:
    text += (f"\nSubmission files (median seeds) in `{root}/submission/`: "
             f"{', '.join(files)}.\n")
  storage.write_atomic(storage.path(root) / "report.md", text)
  storage.write_atomic(storage.path(root) / "report.json",
                       json.dumps(report, indent=2))
  print("\n" + text)
  if failed := [n for n, s in status.items() if s == "failed"]:
    print(f"{len(failed)} of {len(planned)} trials failed: "
          f"{', '.join(failed)}; rerun the command to retry them.")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
