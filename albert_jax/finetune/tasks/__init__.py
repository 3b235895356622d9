"""The task families, one folder each: everything about a kind of task.

  classification/   one label per row: GLUE (`glue.py`), your files
                    (`files.py`); the [CLS] head and classification and
                    regression models (`single_label.py`)
  multiple_choice/  several choices per row: RACE (`race.py`), your files
                    (`files.py`); the head and its models (`choices.py`)
  tagging/          a label per word: CoNLL-2003 and your CoNLL files
                    (`ner.py`), entity-level scores (`conlleval.py`)
  squad/            answer spans: SQuAD v1.1/v2.0, ALBERT's v2.0 head, the
                    official scripts

A family's package names its `TASKS`, its `TASK_TYPES` and
`make_task(name, data)`; `albert_jax.finetune.registry.FAMILIES` lists the
families.
"""
