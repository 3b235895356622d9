r"""Fine-tunes on a GLUE task with the ALBERT paper's Table 14 settings.

  python -m albert_jax.main --config=configs/glue.py:task=mrpc \
      --config.init=/path/to/albert-base-v2 --workdir=/tmp/glue_mrpc

`--config.init` takes anything `load_pretrained` takes (an albert_jax
workdir, an HF directory, an official ALBERT release). Data comes from TFDS
(`--config.data.tfds_data_dir` to point at a prepared copy). Evaluates on the
dev set(s) every `eval_every_steps`, keeps the best checkpoint by the task's
metric (MCC for CoLA, Pearson for STS-B, F1 for MRPC/QQP, matched accuracy
for MNLI, accuracy otherwise), and writes the GLUE submission TSVs of the
test sets from it into `workdir/predictions`.

Arguments: `task=NAME` (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli).
"""

from albert_jax import config_lib

# Table 14: learning rate, batch, dropout, train steps, warmup, max length.
# The official run_glue.sh uses these values (and seq 512 for every task).
TABLE_14 = {
    "cola": (1e-5, 16, 0.0, 5336, 320, 512),
    "stsb": (2e-5, 16, 0.0, 3598, 214, 512),
    "sst2": (1e-5, 32, 0.0, 20935, 1256, 512),
    "mnli": (3e-5, 128, 0.0, 10000, 1000, 512),
    "qnli": (1e-5, 32, 0.0, 33112, 1986, 512),
    "qqp": (5e-5, 128, 0.1, 14000, 1000, 512),
    "rte": (3e-5, 32, 0.1, 800, 200, 512),
    "mrpc": (2e-5, 32, 0.0, 800, 200, 512),
    "wnli": (2e-5, 16, 0.1, 2000, 250, 128),
}


def get_config(arg=None):
  args = config_lib.parse_arg(arg, task="mrpc")
  c = config_lib.table_14_config(TABLE_14, args.task, task=f"glue/{args.task}",
                                 what="GLUE task")
  # The official scripts evaluate every saved checkpoint and keep the best.
  c.eval_every_steps = c.checkpoint_every_steps = max(
      c.num_train_steps // 10, 50)
  return c
