"""Token classification: a tag per word (named entities, BIO/IOB2/IOBES).

CoNLL-2003 and your own CoNLL-format files, the per-token head, loss and
task type (`ner.py`); entity-level scores as conlleval computes them
(`conlleval.py`).
"""

from albert_jax.finetune.tasks.tagging import ner

TASKS = ner.TASKS
TASK_TYPES = (ner.TOKEN_CLASSIFICATION,)
make_task = ner.make_task
