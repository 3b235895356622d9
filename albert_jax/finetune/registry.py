"""Task names → `Task` objects (`config.data.task`), and task types →
`TaskType` objects (a fine-tuned model's recorded "task_type").

A name is checked against every task the families define before anything
is built, so a misspelt one ("glue/sst-2", "ner/file") fails with the
closest valid name instead of a family's own narrower error, or none.

Everything that works from a recorded fine-tuned model (reloading,
prediction, files of predictions, transformers export and import) reaches
its kind through `task_type`; see `albert_jax.finetune.task_type`.
"""

from __future__ import annotations

import importlib

from albert_jax import hints
from albert_jax.finetune.task import Task
from albert_jax.finetune.task_type import PredictError
from albert_jax.finetune.task_type import TaskType
from albert_jax.interop.workdir import TASK_FILE

# Name prefix → module with `make_task(name, data)`.
FAMILIES = {
    "glue/": "albert_jax.finetune.glue",
    "squad/": "albert_jax.finetune.squad.task",
    "race/": "albert_jax.finetune.race",
    "files": "albert_jax.finetune.file_task",
    "ner/": "albert_jax.finetune.tagging",
    "choice/": "albert_jax.finetune.choice",
}
# The names of a family whose module keeps no `TASKS` tuple.
_NAMES = {"albert_jax.finetune.choice": ("choice/files",)}
# task.json "task_type" → the module attribute holding its `TaskType`.
TASK_TYPES = {
    "classification": "albert_jax.finetune.classification.CLASSIFICATION",
    "regression": "albert_jax.finetune.classification.REGRESSION",
    "multiple_choice": "albert_jax.finetune.multiple_choice.MULTIPLE_CHOICE",
    "question_answering":
        "albert_jax.finetune.squad.task_type.QUESTION_ANSWERING",
    "token_classification":
        "albert_jax.finetune.tagging.TOKEN_CLASSIFICATION",
}


def _family(name: str) -> str | None:
  for prefix, module in FAMILIES.items():
    if name == prefix.rstrip("/") or name.startswith(prefix):
      return module
  return None


def task_names() -> tuple[str, ...]:
  """Every task name the families define, in FAMILIES' order."""
  names = []
  for module in FAMILIES.values():
    names += _NAMES.get(module) or importlib.import_module(module).TASKS
  return tuple(names)


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
  return importlib.import_module(_family(name)).make_task(name, data)


def task_type(name: str) -> TaskType:
  """The `TaskType` of a recorded "task_type" `name`.

  Raises:
    PredictError: a name this version does not know.
  """
  if not isinstance(name, str) or name not in TASK_TYPES:
    raise PredictError(f"Unknown task_type {name!r} in {TASK_FILE}; this "
                       f"version of albert_jax predicts "
                       f"{tuple(TASK_TYPES)}.")
  module, attribute = TASK_TYPES[name].rsplit(".", 1)
  return getattr(importlib.import_module(module), attribute)
