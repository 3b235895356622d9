"""One process of a (possibly multi-process) sharded training run.

test_multihost.py starts two of these, each with 4 fake CPU devices and
`jax.distributed` joining them into one 8-device system, plus one
single-process run with 8 devices as the reference:

  python tests/multihost_worker.py --num_processes=2 --process_id=0 \
      --port=PORT --workdir=DIR --out=OUT.json

Each process builds the mesh over all 8 devices, creates the sharded train
state, trains NUM_STEPS steps on global batches to which it contributes its
own rows (`jax.make_array_from_process_local_data`), saves an asynchronous
orbax checkpoint through `albert_jax.training.checkpoints`, restores it,
checks every local shard of the restored state against the live one, and
takes one more step from the restored state. It writes its losses and checks
as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import sharding_worker as common

MESH = [("data", 2), ("fsdp", 2), ("tensor", 2)]
NUM_STEPS = 3


def _global_batch(data_sharding, step: int):
  """Global step `step`'s batch, this process contributing its rows."""
  import jax  # pylint: disable=g-import-not-at-top

  from albert_jax import sharding  # pylint: disable=g-import-not-at-top
  full = common.batch(step)
  rows = sharding.process_batch_rows(data_sharding, common.BATCH_SIZE)
  return {k: jax.make_array_from_process_local_data(data_sharding, v[rows],
                                                    v.shape)
          for k, v in full.items()}, rows


def _compare_local_shards(live, restored, shardings) -> dict:
  """Every addressable shard of `restored` against `live`, bit for bit."""
  import jax  # pylint: disable=g-import-not-at-top
  leaves = 0
  shards = 0
  problems = []
  flat_live = jax.tree_util.tree_flatten_with_path(live)[0]
  flat_restored = jax.tree.leaves(restored)
  flat_shardings = jax.tree.leaves(shardings)
  if len(flat_live) != len(flat_restored):
    return {"leaves": 0, "shards": 0, "problems": [
        f"{len(flat_live)} live leaves, {len(flat_restored)} restored"]}
  for (path, a), b, s in zip(flat_live, flat_restored, flat_shardings):
    name = jax.tree_util.keystr(path)
    leaves += 1
    if not b.sharding.is_equivalent_to(s, b.ndim):
      problems.append(f"{name}: restored sharding {b.sharding}, want {s}")
    if a.shape != b.shape or a.dtype != b.dtype:
      problems.append(f"{name}: {b.shape} {b.dtype}, live {a.shape} {a.dtype}")
      continue
    mine = {(sh.device.id, str(sh.index)): sh.data
            for sh in a.addressable_shards}
    for sh in b.addressable_shards:
      shards += 1
      other = mine.get((sh.device.id, str(sh.index)))
      if other is None:
        problems.append(f"{name}: shard {sh.index} on {sh.device} not live")
      elif not np.array_equal(np.asarray(other), np.asarray(sh.data)):
        problems.append(f"{name}: shard {sh.index} on {sh.device} differs")
  return {"leaves": leaves, "shards": shards, "problems": problems}


def run(args) -> dict:
  """The run; returns what the test asserts on."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_default_matmul_precision", "highest")
  if args.num_processes > 1:
    # Cross-process collectives on CPU go through gloo (JAX's default in
    # 0.10; named here so that a changed default cannot silently hang).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.num_processes, process_id=args.process_id,
        initialization_timeout=args.timeout)

  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  from albert_jax import sharding  # pylint: disable=g-import-not-at-top
  from albert_jax.training import checkpoints  # pylint: disable=g-import-not-at-top
  from albert_jax.training import state as state_lib  # pylint: disable=g-import-not-at-top
  from albert_jax.training import step as step_lib  # pylint: disable=g-import-not-at-top

  out = {"process_index": jax.process_index(),
         "process_count": jax.process_count(),
         "device_count": jax.device_count(),
         "local_device_count": jax.local_device_count()}
  c = common.config()
  spec, tx, schedule = common.spec_and_optimizer(c)
  init = common.init_fn(spec, tx)
  mesh = sharding.make_mesh(MESH)
  rules = sharding.rules_for(mesh, [tuple(r) for r in c.sharding_rules])
  out["mesh"] = dict(mesh.shape)
  rng = jax.random.key(c.seed)
  state, shardings = state_lib.create_state(init, tx, mesh, rules, rng)
  step = step_lib.jit_train_step(
      step_lib.make_train_step(spec.objective, tx, schedule), shardings, mesh,
      rules)
  data = sharding.data_sharding(mesh)

  losses = []
  for i in range(NUM_STEPS):
    batch, rows = _global_batch(data, i)
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  out["local_rows"] = [rows.start, rows.stop]
  out["batch_fully_addressable"] = batch["input_ids"].is_fully_addressable
  out["params_fully_addressable"] = all(
      x.is_fully_addressable for x in jax.tree.leaves(state["params"]))

  mngr = checkpoints.manager(args.workdir, keep=2, async_save=True)
  out["saved"] = checkpoints.save(mngr, state, {"step": NUM_STEPS},
                                  force=True)
  mngr.wait_until_finished()
  mngr.close()

  # Restore through a new manager, as a restarted run would.
  mngr = checkpoints.manager(args.workdir, keep=2, async_save=True)
  out["steps_on_disk"] = list(mngr.all_steps())
  abstract = jax.eval_shape(init, rng)
  abstract = {**abstract, "params": nn.meta.unbox(abstract["params"])}
  restored = checkpoints.restore_latest(mngr, abstract, shardings)
  mngr.close()
  if restored is None:
    raise RuntimeError(f"No checkpoint restored from {args.workdir}.")
  restored_state, meta = restored
  out["meta"] = meta
  out["restored_step"] = int(restored_state["step"])
  out["compare"] = _compare_local_shards(state, restored_state, shardings)

  # One more step from the restored state, and from the live one: resuming
  # continues the run exactly.
  batch, _ = _global_batch(data, NUM_STEPS)
  _, metrics = step(restored_state, batch)
  losses.append(float(metrics["loss"]))
  out["losses"] = losses
  _, metrics = step(state, batch)
  out["uninterrupted_loss"] = float(metrics["loss"])
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--num_processes", type=int, default=1)
  parser.add_argument("--process_id", type=int, default=0)
  parser.add_argument("--port", type=int, default=0)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--timeout", type=int, default=60)
  args = parser.parse_args()
  # Before JAX starts: 8 devices in all, split evenly over the processes.
  os.environ.update(common.subprocess_env(
      common.NUM_DEVICES // args.num_processes))
  start = time.time()
  out = run(args)
  out["seconds"] = time.time() - start
  with open(args.out, "w") as f:
    json.dump(out, f)
  if args.num_processes > 1:
    import jax  # pylint: disable=g-import-not-at-top
    jax.distributed.shutdown()


if __name__ == "__main__":
  main()
