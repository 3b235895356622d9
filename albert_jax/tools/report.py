r"""Compare pre-training runs: a markdown table and their training curves.

  python -m albert_jax.tools.report RUN_DIR... [--out=DIR]
  python -m albert_jax.tools.report /tmp/ablate_sharing/*/ --out=/tmp/ablate_sharing

Each RUN_DIR is a pre-training workdir of `python -m albert_jax.main` (one
trial of `python -m albert_jax.tools.sweep`): its config.json, final_metrics.json
and tensorboard/metrics.jsonl. Writes DIR/report.md, a table of the run
name, the config values that differ between the runs, the final eval
metrics, the encoder's parameter count (embeddings, encoder and pooler, the
paper's convention: ALBERT-base has 12M) and the total training FLOPs
(`flops.training_flops_per_step` × steps trained, as ELECTRA compares
models), and DIR/curves.png, train/loss and every eval metric against the
step, one line per run. The table is also printed.

The curves need matplotlib. They are drawn from metrics.jsonl, which the
trainer writes beside its TensorBoard event files (`metrics.Writer`).

RUN_DIRs and DIR are local (`~` expanded) or gs://BUCKET/PATH. A RUN_DIR with
wildcards (`*`, `?`, `[...]`) is expanded here, so `'gs://b/sweep/*/'` (which
no shell expands) names every run of a sweep.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import math
import os
import sys
from typing import Any, Mapping, Sequence

from albert_jax import storage
from albert_jax.model.config import ModelConfig
from albert_jax.training import defaults
from albert_jax.training import metrics

TABLE_FILE = "report.md"
CURVES_FILE = "curves.png"


class ReportError(ValueError):
  """A directory that is not a finished pre-training run, or a bad JSON or
  JSONL file in one."""


################################################################################
# Runs.
################################################################################


@dataclasses.dataclass
class Run:
  """A finished pre-training run, as read from its workdir.

  Attributes:
    name: how the report names it (the directory's name).
    path: the workdir.
    config: config.json, nested.
    final: final_metrics.json.
    scalars: the logged scalars (metrics.jsonl), tag → [(step, value)].
  """
  name: str
  path: str
  config: dict[str, Any]
  final: dict[str, Any]
  scalars: dict[str, list[tuple[int, float]]]


def _read_json(path: str, what: str) -> dict[str, Any]:
  try:
    value = json.loads(storage.path(path).read_bytes())
  except json.JSONDecodeError as e:
    raise ReportError(f"{path} is not valid JSON ({e}); {what}") from None
  if not isinstance(value, dict):
    raise ReportError(f"{path} holds no JSON object; {what}")
  return value


def load_run(path: str) -> Run:
  """Reads a pre-training workdir (local or gs://); a clear error names what
  is missing."""
  path = os.fspath(path)
  path = path if storage.is_remote(path) else os.path.normpath(path)
  path = path.rstrip("/") or path
  if not storage.path(path).is_dir():
    raise ReportError(f"{path} is not a directory; give the workdirs of "
                      "pre-training runs (e.g. a sweep's WORKDIR_ROOT/*/).")
  not_run = (f"{path} is not a finished pre-training run (a workdir of "
             "python -m albert_jax.main)")
  config_path = f"{path}/config.json"
  if not storage.path(config_path).exists():
    raise ReportError(f"{not_run}: it has no config.json.")
  config = defaults.upgrade(_read_json(
      config_path, "the trainer writes it when it starts."))
  if config["job"] != "pretrain":
    raise ReportError(f"{path} is a {config['job']} run; the report compares "
                      "pre-training runs.")
  metrics_path = f"{path}/final_metrics.json"
  if not storage.path(metrics_path).exists():
    raise ReportError(
        f"{not_run}: it has no final_metrics.json, which the trainer writes "
        "when training ends; rerun the same command to finish it.")
  final = _read_json(metrics_path, "the trainer writes it when training ends.")
  final.update(downstream(path))
  logdir = f"{path}/tensorboard"
  if not storage.path(f"{logdir}/{metrics.METRICS_FILE}").exists():
    raise ReportError(
        f"{not_run}: it has no {logdir}/{metrics.METRICS_FILE}.")
  return Run(storage.path(path).name, path, config, final,
             read_scalars(logdir))


# A pre-training config's fine-tuning stage (`config.finetune`) writes here,
# and its random-init baseline (`compare_random_init`) beside it.
DOWNSTREAM = {"finetune": "downstream", "finetune_random_init": "random_init"}


def downstream(path: str) -> dict[str, float]:
  """The test-set metrics of the run's fine-tuning stage, where it has one:
  `downstream_test/accuracy` from WORKDIR/finetune/final_metrics.json and
  `random_init_test/accuracy` from WORKDIR/finetune_random_init/."""
  out = {}
  for directory, prefix in DOWNSTREAM.items():
    metrics_path = f"{path}/{directory}/final_metrics.json"
    if storage.path(metrics_path).exists():
      final = _read_json(metrics_path, "the fine-tuning stage writes it when "
                         "it ends.")
      out.update({f"{prefix}_{k[len('eval_'):]}": v for k, v in final.items()
                  if k.startswith("eval_test/") and not k.endswith(
                      "majority_baseline_accuracy")})
  return out


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """tag → [(step, value)] sorted by step, from `logdir`/metrics.jsonl.

  A step logged again after a resume takes its latest value. A last line cut
  short (a run killed while writing) ends the file; any other line that is
  not a logged step is an error naming it.
  """
  path = f"{os.fspath(logdir).rstrip('/')}/{metrics.METRICS_FILE}"
  lines = storage.path(path).read_bytes().decode("utf-8").split("\n")
  series: dict[str, dict[int, float]] = {}
  for number, line in enumerate(lines, 1):
    if not line:
      continue
    try:
      row = json.loads(line)
      step = row.pop("step")
    except (json.JSONDecodeError, AttributeError, KeyError):
      if number == len(lines):  # no newline after it: cut short
        break
      raise ReportError(f"{path}: line {number} is not a logged step: "
                        f"{line[:80]!r}") from None
    for tag, value in row.items():
      series.setdefault(tag, {})[step] = value
  return {tag: sorted(points.items()) for tag, points in series.items()}


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """{"model.share": "all", ...}: a nested config with dotted keys."""
  flat = {}
  for key, value in config.items():
    if isinstance(value, Mapping):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value
  return flat


def varied_keys(runs: Sequence[Run]) -> list[str]:
  """Dotted config keys whose values are not the same in every run."""
  flats = [flatten(r.config) for r in runs]
  keys = list(dict.fromkeys(k for f in flats for k in f))
  return [k for k in keys
          if len({json.dumps(f.get(k), sort_keys=True) for f in flats}) > 1]


def model_config(run: Run) -> ModelConfig:
  """The run's `ModelConfig`."""
  try:
    return ModelConfig.from_dict(run.config["model"])
  except (KeyError, TypeError, ValueError) as e:
    raise ReportError(f"{run.path}/config.json: no valid model section "
                      f"({e}).") from None


@functools.lru_cache(maxsize=64)
def _encoder_params(cfg: ModelConfig) -> int:
  # Traces the model's shapes (a second or so): runs of one sweep often
  # share a model, so each is counted once.
  from albert_jax.tools import summary  # pylint: disable=g-import-not-at-top
  rows = summary.summarize(cfg)
  return next(r.params for r in rows if r.name == summary.ENCODER_TOTAL)


def parameter_count(run: Run) -> int:
  """Encoder parameters: embeddings, encoder and pooler, without heads; for
  an ELECTRA run the discriminator's (it has no pooler), as ELECTRA's paper
  counts its models."""
  if run.config.get("pretraining") == "electra":
    import ml_collections  # pylint: disable=g-import-not-at-top

    from albert_jax.tools import summary  # pylint: disable=g-import-not-at-top
    rows = summary.summarize_run(ml_collections.ConfigDict(run.config),
                                 model_config(run))
    return next(r.params for r in rows
                if r.name == summary.BARE_ENCODER_TOTAL)
  return _encoder_params(model_config(run))


def steps_trained(run: Run) -> int:
  """The final step of the run (the configured steps if none is recorded)."""
  return int(run.final.get("step", run.config["num_train_steps"]))


def training_flops(run: Run) -> int:
  """Analytic FLOPs of the whole run, counted as the trainer counts MFU."""
  from albert_jax.training import run_spec  # pylint: disable=g-import-not-at-top
  config = run.config
  try:
    per_step = run_spec.run_spec(config, model_config(run)).flops_per_step
  except (KeyError, AttributeError) as e:
    raise ReportError(f"{run.path}/config.json lacks {e}; is it a "
                      "pre-training config?") from None
  return per_step * steps_trained(run)


################################################################################
# The table and the curves.
################################################################################


def _cell(value: Any) -> str:
  if value is None:
    return ""
  if isinstance(value, bool):
    text = str(value).lower()
  elif isinstance(value, float):
    text = f"{value:.4g}"
  elif isinstance(value, (list, dict)):
    text = json.dumps(value)
  else:
    text = str(value)
  return text.replace("|", r"\|")


def eval_metric_names(runs: Sequence[Run]) -> list[str]:
  """The numeric eval_* keys of final_metrics.json, then the fine-tuning
  stage's test metrics (`downstream`), first-seen order."""
  return list(dict.fromkeys(
      k for r in runs for k, v in r.final.items()
      if k.startswith(("eval_", *(f"{p}_" for p in DOWNSTREAM.values())))
      and isinstance(v, (int, float))
      and not isinstance(v, bool)))


def report_table(runs: Sequence[Run]) -> str:
  """Markdown: run, varied config values, step, eval metrics, params, FLOPs.

  Parameters print with thousands separators, FLOPs as `1.234e+15`, other
  numbers with 4 significant digits; a metric a run lacks is left empty.
  """
  varied, names = varied_keys(runs), eval_metric_names(runs)
  rows = [["run", *varied, "step", *names, "params", "train FLOPs"]]
  for run in runs:
    flat = flatten(run.config)
    rows.append([
        _cell(run.name), *(_cell(flat.get(k)) for k in varied),
        str(steps_trained(run)), *(_cell(run.final.get(k)) for k in names),
        f"{parameter_count(run):,}", f"{training_flops(run):.3e}"])
  lines = ["| " + " | ".join(r) + " |" for r in rows]
  lines.insert(1, "|" + "---|" * len(rows[0]))
  return "\n".join(lines)


def curve_tags(runs: Sequence[Run]) -> list[str]:
  """train/loss, then every eval tag but the fixed baselines, sorted."""
  tags = {t for r in runs for t in r.scalars}
  evals = sorted(t for t in tags if t.startswith("eval/")
                 and not t.endswith("baseline_accuracy"))
  return [t for t in ("train/loss",) if t in tags] + evals


def plot_curves(runs: Sequence[Run], path: str) -> None:
  """Writes a PNG to `path` (local or gs://): one panel per `curve_tags`
  tag, one line per run."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ReportError("The training curves need matplotlib: pip install "
                      "-e '.[report]' (or pip install matplotlib).") from None
  matplotlib.use("Agg")  # files only: no display needed
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  tags = curve_tags(runs)
  if not tags:
    raise ReportError("No train/loss or eval/* scalars in any run's "
                      "tensorboard/ directory; nothing to plot.")
  cols = min(3, len(tags))
  rows = math.ceil(len(tags) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows),
                           squeeze=False)
  for ax, tag in zip(axes.flat, tags):
    for run in runs:
      points = run.scalars.get(tag)
      if points:
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o" if tag.startswith("eval/") else None,
                markersize=3, label=run.name)
    ax.set_title(tag)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(tags):]:
    ax.set_visible(False)
  handles, labels = axes.flat[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", fontsize="small",
             ncol=max(1, min(len(labels), 2)), bbox_to_anchor=(0.5, 0.0))
  fig.tight_layout(rect=(0, 0.06 + 0.03 * math.ceil(len(labels) / 2), 1, 1))
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=100)
  plt.close(fig)
  storage.write_atomic(path, png.getvalue())


def _unique_names(runs: list[Run]) -> None:
  """Runs from different sweeps may share a directory name: use paths then."""
  if len({r.name for r in runs}) < len(runs):
    for run in runs:
      run.name = run.path


def expand_run_dirs(args: Sequence[str]) -> list[str]:
  """The run directories the arguments name: an argument with wildcards
  (`*`, `?`, `[`) stands for the directories it matches, in sorted order.

  Raises:
    ReportError: a pattern that matches no directory.
  """
  dirs = []
  for arg in args:
    if not any(c in arg for c in "*?["):
      dirs.append(arg)
      continue
    pattern = arg.rstrip("/") or arg
    matches = [os.fspath(p) for p in storage.glob(pattern) if p.is_dir()]
    if not matches:
      raise ReportError(f"{arg} matches no directory; give the workdirs of "
                        "pre-training runs (e.g. a sweep's WORKDIR_ROOT/*/).")
    dirs += matches
  return dirs


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m albert_jax.tools.report",
                              description=__doc__.split("\n")[0])
  p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                 help="Pre-training workdirs, e.g. WORKDIR_ROOT/*/.")
  p.add_argument("--out", default=".", help=f"Where {TABLE_FILE} and "
                 f"{CURVES_FILE} are written (default: here).")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  try:
    runs = [load_run(d) for d in expand_run_dirs(args.run_dirs)]
    _unique_names(runs)
    table = report_table(runs)
    out = args.out.rstrip("/") or args.out
    storage.path(out).mkdir(parents=True, exist_ok=True)
    curves = f"{out}/{CURVES_FILE}"
    plot_curves(runs, curves)
  except ReportError as e:
    print(f"report: {e}", file=sys.stderr)
    return 2
  storage.write_atomic(
      f"{out}/{TABLE_FILE}", f"# Pre-training runs\n\n{table}\n\n"
      f"![training curves]({CURVES_FILE})\n")
  print(table)
  print(f"\nWrote {out}/{TABLE_FILE} and {curves}.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
