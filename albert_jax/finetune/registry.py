"""The task families: task names → `Task` objects (`config.data.task`), and
task types → `TaskType` objects (a fine-tuned model's recorded "task_type").

Each family is a package under `albert_jax/finetune/tasks/` that owns
everything about its tasks (data, features, head, loss, metrics, prediction,
transformers conversion) and says so in three names:
  TASKS: the task names it defines ("glue/sst2", "files", ...).
  TASK_TYPES: the `TaskType`s its fine-tuned models record.
  make_task(name, data): the `Task` called `name`, configured by
    `config.data`.
and, where it has config fields with a fixed set of values, in a fourth:
  CONFIG_CHOICES: "data.FIELD" → the values it accepts, which the start
    checks (`config_check.check(..., choices=config_choices())`) read.
A new family is one folder and one line of `FAMILIES`.

A name is checked against every task the families define before anything
is built, so a misspelt one ("glue/sst-2", "ner/file") fails with the
closest valid name instead of a family's own narrower error, or none.
Everything that works from a recorded fine-tuned model (reloading,
prediction, files of predictions, transformers export and import) reaches
its kind through `task_type`; see `albert_jax.finetune.task_type`.
"""

from __future__ import annotations

import functools
import importlib
import types

from albert_jax import hints
from albert_jax.finetune.task import Task
from albert_jax.finetune.task_type import PredictError
from albert_jax.finetune.task_type import TaskType
from albert_jax.interop.workdir import TASK_FILE

# The task families, in the order their names are listed.
FAMILIES = (
    "albert_jax.finetune.tasks.classification",  # glue/NAME, files
    "albert_jax.finetune.tasks.multiple_choice",  # race/NAME, choice/files
    "albert_jax.finetune.tasks.squad",  # squad/v1.1, squad/v2.0
    "albert_jax.finetune.tasks.tagging",  # ner/files, ner/conll2003
)


@functools.cache
def _families() -> tuple[types.ModuleType, ...]:
  return tuple(importlib.import_module(m) for m in FAMILIES)


def task_names() -> tuple[str, ...]:
  """Every task name the families define, in FAMILIES' order."""
  return tuple(n for family in _families() for n in family.TASKS)


def config_choices() -> dict[str, tuple[str, ...]]:
  """Every family's CONFIG_CHOICES: config field → the values it accepts."""
  return {key: tuple(names) for family in _families()
          for key, names in getattr(family, "CONFIG_CHOICES", {}).items()}


def task_types() -> dict[str, TaskType]:
  """Every recorded "task_type" the families define → its `TaskType`."""
  return {kind.name: kind for family in _families()
          for kind in family.TASK_TYPES}


def task_type_of_hf(task_class: str, hf_config: dict) -> TaskType | None:
  """The type of a transformers task checkpoint of class `task_class`
  ("ForSequenceClassification") and config `hf_config`, or None."""
  return next((kind for kind in task_types().values()
               if kind.hf_class == task_class and kind.reads_hf(hf_config)),
              None)


def check_name(name) -> None:
  """Refuses a task name no family defines, with the closest valid one.

  Raises:
    ValueError: one line naming the task, the closest name and the choices.
  """
  names = task_names()
  if name in names:
    return
  hint = hints.did_you_mean(name, names)
  glue = [n[len("glue/"):] for n in names if n.startswith("glue/")]
  others = [n for n in names if not n.startswith("glue/")]
  raise ValueError(
      f"Unknown task config.data.task={name!r}{hint}; use glue/NAME "
      f"({', '.join(glue)}) or {', '.join(others)} ('files', ner/files and "
      "choice/files read your own TSV/CSV/JSONL, CoNLL-format and "
      "multiple-choice files).")


def make_task(name: str, data) -> Task:
  """The task called `name`, configured by `config.data`.

  Raises:
    ValueError: an unknown name (`check_name`), or the family's own
      errors in `data`.
  """
  check_name(name)
  family = next(f for f in _families() if name in f.TASKS)
  return family.make_task(name, data)


def task_type(name: str) -> TaskType:
  """The `TaskType` of a recorded "task_type" `name`.

  Raises:
    PredictError: a name this version does not know.
  """
  kinds = task_types()
  if not isinstance(name, str) or name not in kinds:
    raise PredictError(f"Unknown task_type {name!r} in {TASK_FILE}; this "
                       f"version of albert_jax predicts {tuple(kinds)}.")
  return kinds[name]
