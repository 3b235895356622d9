"""Every config value checked at start, before anything is written.

A value that cannot run (a cadence of 0, a batch of 0, a misspelt
objective, a probability above 1, float16 without loss scaling) used to
surface as a ZeroDivisionError after the first step, a raw library error,
or nothing at all (a misspelt `data.objective` with a prepared data_dir
silently dropped the sentence head). `check` reads the config as the user
gave it, one rule per field, and raises one `ConfigError` line naming each
bad key, its value, what is allowed and an example of the fix.

Only the fields a config has are checked: pre-training and fine-tuning
configs share this module, and a fine-tuning config's model section holds
overrides (None: keep the checkpoint's value). A choice field is checked
against the choices its owner declares (`CHOICES`). `config.data.task` is
checked against the task names the caller passes (`check(...,
task_names=...)`), and the task families' own fields against the choices it
passes (`check(..., choices=...)`): the registry of tasks is fine-tuning's,
above this stage, so the CLI passes `finetune.registry.task_names()` and the
fine-tuning run and the CLI `finetune.registry.config_choices()`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from albert_jax import hints
from albert_jax.data import instances
from albert_jax.model import config as model_config
from albert_jax.text import tokenizer
from albert_jax.training import optimizer
from albert_jax.training import run_spec

# What each choice field accepts, as the module that acts on it declares it.
CHOICES: dict[str, tuple[str, ...]] = {
    "pretraining": run_spec.KINDS,
    "data.objective": instances.OBJECTIVES,
    "data.tokenizer_type": tokenizer.KINDS,
    "model.dtype": model_config.TRAINING_DTYPES,
    "optimizer.name": optimizer.NAMES,
    "optimizer.schedule": optimizer.SCHEDULES,
}
# The fine-tuning task families' choices (`data.task_type`, `data.v2_head`)
# are above this stage: the caller passes them, `check(..., choices=
# finetune.registry.config_choices())`, as it passes the task names.


class ConfigError(ValueError):
  """Config values that cannot run; the message lists each and its fix."""


def _number(v: Any) -> bool:
  return (isinstance(v, (int, float)) and not isinstance(v, bool)
          and math.isfinite(v))


def _whole(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


class _Choice(NamedTuple):
  """A field that must be one of its owner's CHOICES (or of the choices the
  caller passes): an example value, and why the choices are what they are."""
  example: str
  note: str = ""


# key: (test, what is allowed, an example value), or _Choice
_Rule = tuple[Callable[[Any], bool], str, Any]
_RULES: dict[str, _Rule | _Choice] = {
    "seed": (_whole, "a whole number", 0),
    "batch_size": (lambda v: _whole(v) and v >= 1, "a whole number >= 1", 32),
    "accumulation_steps": (lambda v: _whole(v) and v >= 1,
                           "a whole number >= 1 (1: no accumulation)", 1),
    "log_every_steps": (lambda v: _whole(v) and v >= 1,
                        "a whole number >= 1", 50),
    "eval_every_steps": (lambda v: _whole(v) and v >= 1,
                         "a whole number >= 1", 1000),
    "checkpoint_every_steps": (lambda v: _whole(v) and v >= 1,
                               "a whole number >= 1", 1000),
    "keep_checkpoints": (lambda v: _whole(v) and v >= 1,
                         "a whole number >= 1", 3),
    "eval_batches": (lambda v: _whole(v) and v >= 0,
                     "a whole number >= 0 (0: no evaluation)", 10),
    "max_consecutive_nonfinite": (lambda v: _whole(v) and v >= 1,
                                  "a whole number >= 1", 20),
    "peak_tflops_per_device": (lambda v: _number(v) and v >= 0,
                               "a number >= 0 (0: look it up)", 0.0),
    "pretraining": _Choice("masked_lm"),
    "data.max_seq_length": (lambda v: _whole(v) and v >= 4,
                            "a whole number >= 4", 128),
    "data.objective": _Choice("sop"),
    "data.tokenizer_type": _Choice("sentencepiece"),
    "data.short_seq_prob": (lambda v: _number(v) and 0 <= v <= 1,
                            "a number in [0, 1]", 0.1),
    "data.dupe_factor": (lambda v: _whole(v) and v >= 1,
                         "a whole number >= 1", 1),
    "data.eval_fraction": (lambda v: _number(v) and 0 <= v < 1,
                           "a number in [0, 1)", 0.01),
    "data.num_workers": (lambda v: _whole(v) and v >= 1,
                         "a whole number >= 1", 1),
    "data.pack": (lambda v: _whole(v) and (v == 0 or 2 <= v <= 255),
                  "0 (one instance per row) or K in [2, 255] instances "
                  "per row", 3),
    "data.prefetch": (lambda v: _whole(v) and v >= 0,
                      "a whole number >= 0", 2),
    "masking.max_predictions": (lambda v: _whole(v) and v >= 1,
                                "a whole number >= 1", 20),
    "masking.masked_lm_prob": (lambda v: _number(v) and 0 < v <= 1,
                               "a number in (0, 1]", 0.15),
    "masking.max_ngram": (lambda v: _whole(v) and v >= 1,
                          "a whole number >= 1", 3),
    "masking.mask_token_prob": (lambda v: _number(v) and 0 <= v <= 1,
                                "a number in [0, 1]", 0.8),
    "masking.random_token_prob": (lambda v: _number(v) and 0 <= v <= 1,
                                  "a number in [0, 1]", 0.1),
    "model.dtype": _Choice("bfloat16", " (float16 needs loss scaling, which "
                           "albert_jax does not do; bfloat16 has float32's "
                           "range)"),
    "data.task_type": _Choice("classification"),
    "data.v2_head": _Choice("official"),
    "optimizer.name": _Choice("adamw"),
    "optimizer.schedule": _Choice("polynomial"),
    "goodput.data_stall_share": (lambda v: _number(v) and 0 < v < 1,
                                 "a number in (0, 1)", 0.1),
    "goodput.slow_step_factor": (lambda v: _number(v) and v > 1,
                                 "a number > 1", 3.0),
}


def _get(config: Mapping[str, Any], key: str) -> tuple[bool, Any]:
  node = config
  for part in key.split("."):
    if not hasattr(node, "keys") or part not in node.keys():
      return False, None
    node = node[part]
  return True, node


def _describe(key: str, value: Any, allowed: str, example: Any,
              choices: Sequence[str] = ()) -> str:
  hint = ""
  choices = list(choices)
  if isinstance(value, str) and choices:
    close = hints.closest(value, choices, cutoff=0.5)
    if close:
      example = close[0]
      hint = hints.suggestion(close)
  return (f"config.{key}={value!r} must be {allowed}{hint}, e.g. "
          f"--config.{key}={example}")


def problems(config: Mapping[str, Any],
             task_names: Sequence[str] | None = None,
             choices: Mapping[str, Sequence[str]] | None = None) -> list[str]:
  """One line per config value that cannot run ([] if none); with
  `task_names`, `config.data.task` must be one of them; `choices`: the
  allowed values of fields whose owners are above this stage (a field with
  none is not checked here)."""
  out = []
  every = {**CHOICES, **(choices or {})}
  for key, rule in _RULES.items():
    present, value = _get(config, key)
    if not present or value is None:
      continue
    if isinstance(rule, _Choice):
      names = every.get(key)
      if names is not None and value not in names:
        out.append(_describe(key, value, f"one of {tuple(names)}{rule.note}",
                             rule.example, names))
    elif not rule[0](value):
      out.append(_describe(key, value, rule[1], rule[2]))
  present, task = _get(config, "data.task")
  if (task_names is not None and present and task is not None
      and task not in task_names):
    out.append(_describe("data.task", task, f"one of {tuple(task_names)}",
                         "files", task_names))
  present, profile = _get(config, "profile")
  if present and hasattr(profile, "get"):
    from albert_jax.training import profiling  # pylint: disable=g-import-not-at-top
    out += profiling.problems(profile)
  if out:  # the rules below assume each field is valid
    return out
  present, model = _get(config, "model")
  if present and hasattr(model, "items") and all(
      v is not None for _, v in model.items()):
    # A full model section (pre-training): ModelConfig's own checks. A
    # fine-tuning config's overrides are checked when merged with the
    # checkpoint's config.
    try:
      model_config.ModelConfig.from_dict(model)
    except ValueError as e:
      return [str(e).removeprefix("Invalid model config: ").rstrip(".")]
  values = {k: _get(config, k)[1] for k in (
      "batch_size", "accumulation_steps", "data.max_seq_length",
      "masking.max_predictions", "masking.mask_token_prob",
      "masking.random_token_prob", "model.max_position_embeddings",
      "model.position_ids_from_padding", "model.pad_token_id",
      "eval_batch_size")}
  batch, micro = values["batch_size"], values["accumulation_steps"]
  if batch is not None and micro is not None and batch % micro:
    out.append(f"config.batch_size={batch} must be divisible by "
               f"config.accumulation_steps={micro} (each step splits the "
               "batch into that many micro-batches), e.g. "
               f"--config.accumulation_steps=1")
  seq, preds = values["data.max_seq_length"], values["masking.max_predictions"]
  if seq is not None and preds is not None and preds > seq:
    out.append(f"config.masking.max_predictions={preds} exceeds "
               f"config.data.max_seq_length={seq}; e.g. "
               f"--config.masking.max_predictions={max(1, round(0.15 * seq))}")
  mask, rand = (values["masking.mask_token_prob"],
                values["masking.random_token_prob"])
  if mask is not None and rand is not None and mask + rand > 1:
    out.append(f"config.masking.mask_token_prob={mask} + "
               f"config.masking.random_token_prob={rand} exceed 1 (the rest "
               "of the chosen tokens stay unchanged); e.g. 0.8 and 0.1")
  positions = values["model.max_position_embeddings"]
  if seq is not None and positions is not None:
    offset = ((values["model.pad_token_id"] or 0) + 1
              if values["model.position_ids_from_padding"] else 0)
    if seq + offset > positions:
      out.append(f"config.data.max_seq_length={seq} needs {seq + offset} "
                 f"positions but config.model.max_position_embeddings="
                 f"{positions}; raise it, or lower "
                 f"--config.data.max_seq_length={positions - offset}")
  return out


def _best_metric_problem(config: Mapping[str, Any]) -> str | None:
  """A pre-training config's best_metric must be one its run reports (a
  misspelt one used to turn best-checkpoint keeping off silently)."""
  present, name = _get(config, "best_metric")
  kind = _get(config, "pretraining")[1]
  if not present or not name or kind not in run_spec.BEST_METRICS:
    return None
  allowed = list(run_spec.BEST_METRICS[kind])
  if kind == "masked_lm" and _get(config, "data.objective")[1] == "none":
    allowed.remove("sop_accuracy")  # no sentence task, no such metric
  if name in allowed:
    return None
  hint = hints.did_you_mean(name, allowed, cutoff=0.5)
  return (f"config.best_metric={name!r} is not a metric a {kind} run "
          f"reports{hint}; choose one of {tuple(allowed)}, or '' to keep no "
          f"best checkpoint, e.g. --config.best_metric={allowed[0]}")


def check(config: Mapping[str, Any],
          task_names: Sequence[str] | None = None,
          choices: Mapping[str, Sequence[str]] | None = None) -> None:
  """Raises ConfigError listing every value of `config` that cannot run,
  including the optimizer's (`optimizer.check`) and its own fine-tuning
  stage's (`config.finetune`); with `task_names`, the fine-tuning task's
  name too, and with `choices`, the fields they name (`problems`)."""
  found, cause = problems(config, task_names, choices), None
  best = _best_metric_problem(config) if not found else None
  if best:
    found.append(best)
  # A pre-training run's packing; a fine-tune's is its task's to allow
  # (albert_jax.finetune.spec.pack_for).
  if (not found and _get(config, "data.pack")[1]
      and _get(config, "job")[1] != "finetune"):
    try:
      run_spec.check_pack(config)
    except ValueError as e:
      found.append(str(e).rstrip("."))
  try:
    optimizer.check(config.optimizer, job=config.job,
                    num_train_steps=config.get("num_train_steps"))
  except ValueError as e:
    found.append(str(e).rstrip("."))
    cause = e  # --traceback shows where it came from
  if found:
    raise ConfigError("; ".join(found) + ".") from cause
  stage = config.get("finetune") if hasattr(config, "get") else None
  if stage is not None:
    check(stage, task_names, choices)
