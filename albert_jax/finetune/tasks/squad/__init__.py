"""Extractive question answering: SQuAD v1.1 and v2.0.

Windows, features and the task (`task.py`); the span head and ALBERT's
official v2.0 head (`head.py`); n-best answers and metrics (`evaluate.py`)
by the official scripts (`official.py`); the reloaded model's kind
(`task_type.py`).
"""

from albert_jax.finetune.tasks.squad import task
from albert_jax.finetune.tasks.squad import task_type

TASKS = task.TASKS
TASK_TYPES = (task_type.QUESTION_ANSWERING,)
CONFIG_CHOICES = {"data.v2_head": task.V2_HEADS}
make_task = task.make_task
