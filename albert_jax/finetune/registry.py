"""Task names → `Task` objects (`config.data.task`).

A name is checked against every task the families define before anything
is built, so a misspelt one ("glue/sst-2", "ner/file") fails with the
closest valid name instead of a family's own narrower error, or none.
"""

from __future__ import annotations

import difflib
import importlib

from albert_jax.finetune.task import Task

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
  by_folded = {n.casefold(): n for n in names}
  close = difflib.get_close_matches(str(name).casefold(), list(by_folded),
                                    n=1, cutoff=0.6)
  hint = f" (did you mean {by_folded[close[0]]!r}?)" if close else ""
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
