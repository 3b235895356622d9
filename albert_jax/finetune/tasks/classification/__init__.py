"""Classification and regression: one label per row, read from [CLS].

GLUE through TFDS (`glue.py`) and your own TSV/CSV/JSONL files (`files.py`)
share the head, the task base and the two task types (`single_label.py`);
GLUE's metric definitions are `official_metrics.py`.
"""

from albert_jax.finetune.tasks.classification import files
from albert_jax.finetune.tasks.classification import glue
from albert_jax.finetune.tasks.classification import single_label

TASKS = glue.TASKS + files.TASKS
TASK_TYPES = (single_label.CLASSIFICATION, single_label.REGRESSION)
CONFIG_CHOICES = {"data.task_type": files.TASK_TYPES}


def make_task(name: str, data) -> single_label.SingleLabelTask:
  """The task `name` (one of TASKS), configured by `config.data`."""
  return (glue if name in glue.TASKS else files).make_task(name, data)
