r"""Learning rate × cross-layer sharing on the CPU demo: the sweep-file example.

A sweep file sets CONFIG (the base config, `path.py[:arg]`) and defines
`get_sweep(arg=None)` returning trials, each a dict of dotted overrides of
that config, built with albert_jax.tools.sweep's `axis`, `product`, `zip_`,
`chain` and `fixed`:

  python -m albert_jax.tools.sweep experiments/demo_lr.py --workdir_root=/tmp/demo_lr
  python -m albert_jax.tools.sweep experiments/demo_lr.py:quick \
      --workdir_root=/tmp/demo_lr_quick      # 2 trials of 30 steps
  python -m albert_jax.tools.sweep experiments/demo_lr.py --print_commands \
      --workdir_root=/tmp/demo_lr            # the commands, one per trial

Arguments: `quick` (two learning rates, 30 steps each).
"""

from albert_jax import config_lib
from albert_jax.tools import sweep

CONFIG = "configs/demo.py:steps=200,finetune_steps=0"


def get_sweep(arg=None):
  args = config_lib.parse_arg(arg, quick=False)
  if args.quick:
    return sweep.product(
        sweep.axis("config.optimizer.learning_rate", [2e-3, 8e-3]),
        sweep.fixed({"config.num_train_steps": 30,
                     "config.optimizer.warmup_steps": 3}))
  return sweep.product(
      sweep.axis("config.optimizer.learning_rate", [5e-4, 2e-3, 8e-3]),
      sweep.axis("config.model.share", ["all", "none"]))
