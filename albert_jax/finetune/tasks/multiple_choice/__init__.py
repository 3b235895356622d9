"""Multiple choice: C choices per row, one score each, a softmax over them.

RACE through TFDS (`race.py`) and your own SWAG-style files (`files.py`)
share the featurization, head, task base and task type (`choices.py`).
"""

from albert_jax.finetune.tasks.multiple_choice import choices
from albert_jax.finetune.tasks.multiple_choice import files
from albert_jax.finetune.tasks.multiple_choice import race

TASKS = race.TASKS + files.TASKS
TASK_TYPES = (choices.MULTIPLE_CHOICE,)


def make_task(name: str, data) -> choices.MultipleChoiceTask:
  """The task `name` (one of TASKS), configured by `config.data`."""
  return (race if name in race.TASKS else files).make_task(name, data)
