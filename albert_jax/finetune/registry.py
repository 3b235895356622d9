"""Task names → `Task` objects (`config.data.task`)."""

from __future__ import annotations

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


def make_task(name: str, data) -> Task:
  """The task called `name`, configured by `config.data`."""
  for prefix, module in FAMILIES.items():
    if name == prefix.rstrip("/") or name.startswith(prefix):
      return importlib.import_module(module).make_task(name, data)
  raise ValueError(
      f"Unknown task {name!r}; use glue/NAME (cola, sst2, mrpc, qqp, stsb, "
      "mnli, qnli, rte, wnli), squad/v1.1, squad/v2.0, race/high, "
      "race/middle, race/all, ner/conll2003, 'files' for your own "
      "TSV/CSV/JSONL data, ner/files for your own CoNLL-format files or "
      "choice/files for your own multiple-choice data.")
