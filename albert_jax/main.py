r"""albert_jax's command line: pre-train (and, by config, fine-tune).

  python -m albert_jax.main --config=configs/demo.py --workdir=/tmp/demo
  python -m albert_jax.main --config=configs/albert_base.py:version=1 \
      --workdir=gs://bucket/run --config.batch_size=512 \
      --config.optimizer.learning_rate=3e-4

Every field of the config can be overridden with `--config.a.b=value`; the
config is locked, so a key that does not exist fails with the closest valid
names. `--compile_only` compiles the train step ahead of time for the config's
mesh (`--topology=v5e:16x16`: a TPU slice, by the real TPU compiler;
`--topology=h100`: GPUs, by XLA:GPU, with a roofline of its kernels; or
`--num_fake_devices=N` CPU devices standing in for accelerators, an
estimate) and prints per-device memory without running anything. Multi-host runs
(TPU pods) initialise `jax.distributed` when `--distributed` is set, or when
coordinator flags are given.
"""

from __future__ import annotations

import logging
import os
import sys


# The most CPU devices --num_fake_devices stands up on one host: a v4-1024
# slice's 512 chips. XLA's CPU client starts far more, but every device
# brings its own threads and buffers, and thousands end in a JaxRuntimeError
# (or a host out of memory) before a step compiles.
MAX_FAKE_DEVICES = 512


def _early_fake_devices(argv: list[str]) -> None:
  """--num_fake_devices must act before jax is imported anywhere."""
  for i, arg in enumerate(argv):
    value = None
    if arg.startswith("--num_fake_devices="):
      value = arg.split("=", 1)[1]
    elif arg == "--num_fake_devices" and i + 1 < len(argv):
      value = argv[i + 1]
    if value is not None and not value.isdigit():
      print(f"error: --num_fake_devices={value!r} must be a whole number "
            ">= 0, e.g. --num_fake_devices=8", file=sys.stderr)
      sys.exit(2)
    if value is not None and int(value) > MAX_FAKE_DEVICES:
      print(f"error: --num_fake_devices={value} is more CPU devices than "
            f"one host stands in for (at most {MAX_FAKE_DEVICES}); give a "
            "smaller slice, e.g. --num_fake_devices=8", file=sys.stderr)
      sys.exit(2)
    if value and int(value) > 0:
      flags = os.environ.get("XLA_FLAGS", "")
      os.environ["XLA_FLAGS"] = (
          f"{flags} --xla_force_host_platform_device_count={int(value)}")
      os.environ["JAX_PLATFORMS"] = "cpu"
    if arg == "--topology" or arg.startswith("--topology="):
      # Compiling for a TPU slice or GPUs uses no local accelerator: trace
      # on CPU, leaving a host's chips to whatever runs on them (and the
      # CUDA plugin then gives compile-only devices on a host without one).
      os.environ["JAX_PLATFORMS"] = "cpu"


_early_fake_devices(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from albert_jax import hints

# pylint: enable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (`path.py[:arg]`).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, logs and "
                               "prepared data go; a run resumes from it.")
_TRACEBACK = flags.DEFINE_bool(
    "traceback", False, "On an error in the input (a config value, a file, "
    "a workdir in use), print the full traceback instead of the one-line "
    "`error:` message.")
_COMPILE_ONLY = flags.DEFINE_bool(
    "compile_only", False, "Compile the train step and print per-device "
    "memory; run nothing.")
_TOPOLOGY = flags.DEFINE_string(
    "topology", None, "With --compile_only: compile for this TPU slice with "
    "the real TPU compiler (needs libtpu), e.g. v5e:16x16, v4:2x4x4, "
    "v5p:4x4x4, v6e:16x16; or for these GPUs with XLA:GPU (the gpu_aot "
    "extra), with each kernel's HBM bytes and a modelled step time: h100, "
    "h100:8, h200.")
flags.DEFINE_integer("num_fake_devices", 0, "Use N CPU devices (set before "
                     "JAX starts) to compile for a mesh you do not have.")
_DEVICE_MEMORY = flags.DEFINE_float(
    "device_memory_gib", None, "Per-device memory for --compile_only's "
    "fits / does-not-fit verdict (10% headroom kept).")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Call jax.distributed.initialize() (TPU pods "
    "auto-detect their coordinator).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0, for multi-host.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "Processes in a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "This process's index in a multi-host run.")


def config_key_error(config, key: str) -> str:
  """A message naming the closest valid keys for a dotted `key`."""
  node, parts = config, key.split(".")
  for i, part in enumerate(parts):
    keys = list(node.keys()) if hasattr(node, "keys") else []
    if part not in keys:
      where = ".".join(parts[:i]) or "config"
      hint = hints.did_you_mean(part, keys, n=3, cutoff=0.5)
      return (f"Unknown config key {key!r}: {where} has no field {part!r}"
              f"{hint}. Valid fields there: {', '.join(sorted(keys))}.")
    node = node[part]
  return f"Bad config key {key!r}."


def _config_file(argv: list[str]):
  """The config `--config=FILE.py[:arg]` in `argv` names, loaded as
  config_flags loads it; None if there is none or it does not load (absl
  then reports that itself)."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")),
              None)
  if not spec:
    return None
  path, _, arg = spec.partition(".py:")
  path = path if path.endswith(".py") else path + ".py"
  try:
    import importlib.util  # pylint: disable=g-import-not-at-top
    module_spec = importlib.util.spec_from_file_location("config_file", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  except Exception:  # pylint: disable=broad-except
    return None


def _check_overrides(config, argv: list[str]) -> None:
  """Fails fast, with suggestions, on `--config.x.y` keys that do not exist."""
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    key = arg[len("--config."):].split("=", 1)[0]
    node = config
    for part in key.split("."):
      if hasattr(node, "keys") and part in node.keys():
        node = node[part]
      else:
        raise app.UsageError(config_key_error(config, key))


def maybe_initialize_distributed() -> None:
  if _COORDINATOR.value or _DISTRIBUTED.value:
    if jax.distributed.is_initialized():
      return
    kwargs = {}
    if _COORDINATOR.value:
      kwargs = dict(coordinator_address=_COORDINATOR.value,
                    num_processes=_NUM_PROCESSES.value,
                    process_id=_PROCESS_ID.value)
    jax.distributed.initialize(**kwargs)


def _quiet_libraries() -> None:
  """Our progress at INFO; orbax's and jax's per-save chatter only if bad."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger("albert_jax").setLevel(logging.INFO)


def _input_error(e: BaseException) -> bool:
  """Whether `e` describes bad input (a config value, a file, a checkpoint,
  a workdir in use, training that diverged): its message says what is wrong
  and how to fix it, and a traceback would only bury it."""
  from albert_jax.training import checkpoints  # pylint: disable=g-import-not-at-top
  from albert_jax.training import guards  # pylint: disable=g-import-not-at-top
  from albert_jax.training import lease  # pylint: disable=g-import-not-at-top
  return isinstance(e, (ValueError, OSError, lease.WorkdirBusyError,
                        checkpoints.UnreadableCheckpointError,
                        guards.NonFiniteError))


def main(argv):
  try:
    _main(argv)
  except app.UsageError as e:
    # absl would print every flag's help (43 lines) above the one that
    # matters.
    if _TRACEBACK.value:
      raise
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except Exception as e:  # pylint: disable=broad-except
    if _TRACEBACK.value or not _input_error(e):
      raise
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


def _main(argv):
  del argv
  _quiet_libraries()
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. "
                         "--config=configs/demo.py.")
  maybe_initialize_distributed()
  from albert_jax.training import defaults  # pylint: disable=g-import-not-at-top
  defaults.fill(config)  # the fields a config file of an earlier version lacks
  if _COMPILE_ONLY.value:
    from albert_jax.tools import compile_only  # pylint: disable=g-import-not-at-top
    compile_only.report(config, device_memory_gib=_DEVICE_MEMORY.value,
                        topology=_TOPOLOGY.value)
    return
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required: the directory the run "
                         "keeps its checkpoints, logs and data in (and "
                         "resumes from), e.g. --workdir=/tmp/albert_run.")
  from albert_jax import storage  # pylint: disable=g-import-not-at-top
  workdir = storage.as_str(_WORKDIR.value)  # gs://… or an absolute path
  if not _TRACEBACK.value:  # a failed save is its one error line
    from albert_jax.training import checkpoints  # pylint: disable=g-import-not-at-top
    checkpoints.hide_failed_write_reports()
  job = config.job
  from albert_jax.finetune import registry  # pylint: disable=g-import-not-at-top
  from albert_jax.training import config_check  # pylint: disable=g-import-not-at-top
  # With the demo's fine-tuning stage, if any, and its task's name.
  config_check.check(config, registry.task_names(),
                     registry.config_choices())
  if job == "pretrain":
    from albert_jax.training import pretrain  # pylint: disable=g-import-not-at-top
    result = pretrain.run(config, workdir)
    if config.get("finetune") is not None and "preempted_at" not in result:
      # A pre-training config may end with a fine-tuning stage (the demo).
      from albert_jax.finetune import after_pretraining as after  # pylint: disable=g-import-not-at-top
      result["finetune"] = after.run_after_pretraining(config.finetune,
                                                       workdir)
      if (config.finetune.get("compare_random_init")
          and "preempted_at" not in result["finetune"]):
        result["finetune_random_init"] = after.run_after_pretraining(
            config.finetune, workdir, random_init=True)
  elif job == "finetune":
    from albert_jax.finetune import run as finetune  # pylint: disable=g-import-not-at-top
    result = finetune.run(config, workdir)
  else:
    raise app.UsageError(f"Unknown config.job {job!r}; a config is either "
                         "'pretrain' or 'finetune'.")
  if jax.process_index() == 0:
    from albert_jax.training import metrics  # pylint: disable=g-import-not-at-top
    print(metrics.final_summary(result))


def run():
  # Unknown keys are checked before absl parses them, so the message can
  # name the closest valid fields instead of absl's bare "unknown flag".
  def parse(argv):
    try:
      return flags.FLAGS(argv)
    except SyntaxError as e:  # in the config file, as config_flags loads it
      if "--traceback" in argv:
        raise
      print(f"error: config file {e.filename}, line {e.lineno}: {e.msg} "
            f"({(e.text or '').strip()!r}); fix the file, or give another "
            "--config.", file=sys.stderr)
      sys.exit(2)
    except (flags.Error, AttributeError, KeyError) as e:
      # ml-collections reports an unknown key as AttributeError/KeyError and
      # a bad value as a flags error: one clear line, no tracebacks.
      message = str(e).strip('"')
      bad = [a for a in argv if a.startswith("--config.")]
      config = _config_file(argv) if bad else None
      if config is not None:
        try:
          _check_overrides(config, bad)
        except app.UsageError as usage:
          message = str(usage)
      print(f"error: {message}", file=sys.stderr)
      sys.exit(2)
  app.run(main, flags_parser=parse)


if __name__ == "__main__":
  run()
