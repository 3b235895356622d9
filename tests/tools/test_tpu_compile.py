"""The real TPU compiler on this host: libtpu's compile-only TPU devices.

`--compile_only --topology=NAME` and `compile_only.analyse(topology=...)`
compile for the chips of a named TPU slice (`albert_jax.tools.topology`)
with the TPU compiler, Mosaic included. These tests compile, for real:
  * the Pallas flash-attention kernels, forward and backward, for v4, v5e,
    v5p and v6e: head dims 64 and 128, bfloat16 and float32, causal and
    segment ids, sequences that are and are not multiples of 128;
  * a one-layer tiny ALBERT train step for a v5e slice under FSDP and
    tensor meshes, its attention on the Mosaic kernels (and, under the
    tensor mesh, a vocabulary the tensor axis does not divide);
  * ELECTRA's and the causal LM's pre-training steps and a fine-tuning step;
  * a step too big for the chips, which the compiler refuses (`DoesNotFit`);
  * the CLI, once for the TPU slice with ALBERT-base (two of its shared
    layers: the same parameters, a kernel count per unrolled layer) under a
    data mesh, and once for fake CPU devices, which must agree on the exact
    state bytes; the TPU run's report is also checked for what a data mesh
    compiles to (all-reduced gradients, no gathers).
Shapes stay small: a compile takes seconds (on TPU the layers are unrolled,
so every layer is traced and compiled again: one or two layers, not more).
They skip where libtpu is not installed.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax import config_lib
from albert_jax.ops import attention
from albert_jax.tools import compile_only
from albert_jax.tools import hlo_stats
from albert_jax.tools import topology

# Two processes may not load libtpu at once without this (pytest-xdist's
# workers each load it, and so do the CLI's subprocesses); libtpu loads at
# the first `topology.devices`, after this.
os.environ.setdefault(topology.MULTIPLE_LOAD_ENV, "1")
ROOT = pathlib.Path(__file__).resolve().parents[2]
needs_libtpu = pytest.mark.skipif(
    not topology.libtpu_available(),
    reason=f"libtpu is not installed; {topology.INSTALL_HINT}")
SLICE = "v5e:2x2"  # four v5e chips
KINDS = {"v4:2x2x1": "TPU v4", "v5e:2x2": "TPU v5 lite",
         "v5p:2x2x1": "TPU v5", "v6e:2x2": "TPU v6 lite"}
# (batch, seq, heads, head_dim, dtype, causal, segment ids)
KERNEL_CASES = (
    (1, 128, 2, 64, jnp.bfloat16, True, True),
    (1, 200, 1, 128, jnp.float32, False, True),
    (1, 256, 1, 128, jnp.bfloat16, True, False),
    (2, 72, 2, 64, jnp.float32, False, False),
)
FLASH = ("albert_flash_bwd_dkv", "albert_flash_bwd_dq", "albert_flash_fwd")
# Head dim 64 (the kernel's smallest), one layer (the TPU unrolls the
# layers: each one more is traced and compiled again; the CLI test counts
# kernels over two), no dropout (a kernel hands dropout to XLA).
MODEL = dict(hidden_size=128, num_attention_heads=2, intermediate_size=256,
             num_hidden_layers=1, attention_impl="pallas")


def test_topology_arguments():
  assert topology.parse("v5e:16x16") == ("v5e", (16, 16))
  assert topology.topology_kwargs("v4:2x4x4") == {
      "topology_name": "v4:2x4x4", "platform": "tpu",
      "chip_config_name": "megacore", "wrap": (False, False, False)}
  assert topology.topology_kwargs("v5p:4x4x4") == {
      "topology_name": "v5p:4x4x4", "platform": "tpu",
      "chip_config_name": "megacore", "wrap": (True, True, True)}
  assert topology.topology_kwargs("v6e:8x16") == {
      "topology_name": "v6e:8x16", "platform": "tpu",
      "wrap": (False, True, False)}
  with pytest.raises(ValueError) as e:
    topology.parse("v5e-256")
  assert str(e.value) == (
      "--topology='v5e-256' is not a TPU topology name; use "
      "GENERATION:SHAPE, chips per axis, e.g. v5e:4x4, v5e:16x16, v4:2x4x4, "
      "v5p:4x4x4, v6e:16x16, h100, h100:8, h200.")


@needs_libtpu
def test_a_slice_has_one_device_per_chip():
  devices = topology.devices("v4:2x4x4")  # v4-64: 32 megacore chips
  assert len(devices) == 32
  assert {d.device_kind for d in devices} == {"TPU v4"}
  assert {d.platform for d in devices} == {"tpu"}
  with pytest.raises(ValueError, match=r"^--topology='v5e:3x3': libtpu "
                     r"refuses it \(INVALID_ARGUMENT: Topology layout"):
    topology.devices("v5e:3x3")


def _attention_grads(queries, ids):
  """Σ of every case's attention output, for its gradient w.r.t. q."""
  total = 0.0
  for case, q, seg in zip(KERNEL_CASES, queries, ids):
    out = attention.dot_product_attention(
        q, q * 0.5, q, segment_ids=seg, impl="pallas", causal=case[5])
    total = total + jnp.sum(out.astype(jnp.float32))
  return total


@needs_libtpu
@pytest.mark.parametrize("name", sorted(KINDS))
def test_kernels_compile_with_mosaic(name):
  (chip,) = topology.devices(name)[:1]
  mesh = jax.sharding.Mesh(np.array([chip]), ("data",))
  one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  queries = [jax.ShapeDtypeStruct((b, t, h, d), dtype, sharding=one)
             for b, t, h, d, dtype, _, _ in KERNEL_CASES]
  ids = [jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=one)
         if segments else None
         for b, t, _, _, _, _, segments in KERNEL_CASES]
  assert attention.target_platform() == "cpu"  # this host, no mesh
  with jax.set_mesh(mesh):
    # Kernels are chosen for the mesh's chips, not for this CPU host.
    assert attention.target_platform() == "tpu"
    compiled = jax.jit(jax.grad(_attention_grads)).lower(queries,
                                                          ids).compile()
  assert chip.device_kind == KINDS[name]
  stats = hlo_stats.analyse(compiled.as_text())
  # Forward, dq and dk/dv of each case, every one a Mosaic kernel.
  assert stats.mosaic_kernels == {k: len(KERNEL_CASES) for k in FLASH}


def _tiny(mesh, **model):
  c = config_lib.base_config(config_lib.tiny_model(**{**MODEL, **model}),
                             batch_size=8, max_seq_length=128)
  c.mesh = mesh
  return c


@needs_libtpu
# The tensor-parallel mesh in the long tier: its rules are the same code
# path (test_sharding trains on such a mesh on CPU in the default tier).
@pytest.mark.parametrize("mesh", [
    "fsdp", pytest.param("tensor", marks=pytest.mark.long)])
def test_albert_step_compiles_for_a_v5e_slice(mesh):
  """FSDP: gathered parameters, reduce-scattered gradients; tensor: a
  split vocabulary that needs padding. The data mesh (replicated state,
  all-reduced gradients, no gathers) is the CLI test's TPU run, through
  the same `compile_only.analyse`."""
  meshes = {"fsdp": [("data", 1), ("fsdp", -1)],
            # 1001 words: the tensor axis does not divide the vocabulary.
            "tensor": [("data", -1), ("tensor", 2)]}
  config = _tiny(meshes[mesh], **({"vocab_size": 1001} if mesh == "tensor"
                                 else {}))
  result = compile_only.analyse(config, topology=SLICE)
  assert (result["platform"], result["device_kind"], result["num_devices"],
          result["memory_source"]) == ("tpu", "TPU v5 lite", 4,
                                       "TPU compiler")
  # The one layer runs the three kernels.
  assert result["mosaic_kernels"] == {k: 1 for k in FLASH}
  ops = {op: c["count"] for op, c in result["collectives"].items()}
  if mesh == "data":  # replicated state: gradients all-reduced, no gathers
    assert ops["all-reduce"] > 0 and ops["all-gather"] == 0
  elif mesh == "fsdp":  # parameters gathered, gradients reduce-scattered
    assert ops["all-gather"] > 0 and ops["reduce-scatter"] > 0
  assert result["total"] == (result["arguments"] + result["outputs"]
                             - result["aliased"] + result["temporaries"])
  # The step's matmuls, counted in its HLO, are model.flops' count to the
  # FLOP, and the flash kernels declare 1.5x its attention (their backward
  # recomputes the scores); under the tensor mesh the decoder also
  # multiplies the padding column: 3 × 8 rows × 20 predictions × 2 × E=32
  # FLOPs, over 4 chips.
  attention = result["flops_analytic_attention"]
  padding = 3 * 8 * 20 * 2 * 32 / 4 if mesh == "tensor" else 0
  assert result["flops_hlo_matmuls"] == (
      result["flops_analytic"] - attention + padding)
  assert result["flops_hlo_kernels"] == 1.5 * attention


@needs_libtpu
def test_a_step_too_big_for_the_chip_is_refused():
  # configs/tiny.py's model at 131072 sequences per chip: its activations
  # alone need ~180 GiB.
  config = config_lib.base_config(config_lib.tiny_model(),
                                  batch_size=4 * 131072, max_seq_length=128)
  with pytest.raises(compile_only.DoesNotFit) as e:
    compile_only.analyse(config, topology=SLICE)
  assert str(e.value).startswith(
      "The train step does not fit: RESOURCE_EXHAUSTED: E1000: "
      "CompileTimeHbmOom: Ran out of memory on HBM, the total memory "
      "required for HLO temporaries (")
  assert str(e.value).endswith(
      "Use less memory per chip: model.remat=full (or dots_no_batch), more "
      "accumulation_steps, an FSDP mesh, or more chips.")
  # A v5e chip's 16 GB less what the runtime keeps.
  assert e.value.available_bytes == 15.75 * 2**30
  assert e.value.required_bytes > 10 * e.value.available_bytes


def _load_config(name: str, arg: str):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / name)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@needs_libtpu
@pytest.mark.parametrize("objective", ["electra", "causal_lm", "finetune"])
def test_other_steps_compile(objective):
  no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  if objective == "electra":
    # Generator width 256 / 4 = 64: one head of 64, as the kernel takes.
    config = _load_config("electra_small.py", "tiny")
    config.model.update(dict(MODEL, hidden_size=256, num_attention_heads=4,
                             **no_dropout))
    kernels_per_step = 2  # one layer each of generator and discriminator
  elif objective == "causal_lm":
    config = _load_config("gpt_small.py", "tiny")
    config.model.update(dict(MODEL, embedding_size=128, **no_dropout))
    config.data.max_seq_length = 128
    kernels_per_step = 1
  else:
    config = config_lib.finetune_config(
        "glue/mrpc", learning_rate=1e-5, batch_size=8, num_train_steps=10,
        warmup_steps=1, max_seq_length=128, dropout=0.0)
    config.model = config_lib.tiny_model(**MODEL)
    # Packed rows (segment ids 1..4 in the mask): the fine-tuning step the
    # kernels must take several examples a row in.
    config.data.pack = 4
    kernels_per_step = 1
  config.batch_size = 8
  result = compile_only.analyse(config, topology=SLICE)
  assert result["target"] == {"finetune": "finetune glue/mrpc"}.get(
      objective, objective)
  assert result["mosaic_kernels"] == {k: kernels_per_step for k in FLASH}
  if objective == "finetune":
    # A chip's 2 packed rows of 128: ids, types and segments [2, 128]
    # int32 (the model counts positions from the segments), then [2, 4]
    # slots (each [CLS]'s position, weight, example index, label) and the
    # rows' weights [2].
    assert result["batch"] == 3 * 2 * 128 * 4 + 4 * 2 * 4 * 4 + 2 * 4
    # The report says its 8 rows bound what a packed run takes.
    from albert_jax.tools import compile_report  # pylint: disable=g-import-not-at-top
    assert ("  batch: 8 global, 2 per data-parallel shard, 1 micro-batch of "
            "2; seq 128; optimizer adamw; packed, up to 4 examples a row: a "
            "run takes the rows that hold batch_size examples (fewer), so "
            "this compile of batch_size rows is an upper bound\n"
            ) in compile_report.format_report(
                compile_report.StepShape.from_config(config), result)


# ALBERT-base shares its layers: two of them hold the same parameters as
# twelve, and each one more that the TPU unrolls only adds compile time.
CLI_LAYERS = 2


def _cli(*args):
  return subprocess.Popen(
      [sys.executable, "-m", "albert_jax.main",
       "--config=configs/albert_base.py", "--compile_only",
       "--config.model.dtype=bfloat16", "--config.batch_size=8",
       "--config.data.max_seq_length=128",
       f"--config.model.num_hidden_layers={CLI_LAYERS}", *args],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env={**os.environ, "PYTHONPATH": str(ROOT)})


def _finish(proc):
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  match = re.search(r"^bytes per device: (\{.*\})$", out, re.M)
  return out, json.loads(match.group(1))


@pytest.mark.long
@needs_libtpu
def test_cli_tpu_and_cpu_agree_on_the_state():
  """ALBERT-base on four v5e chips, Pallas attention, against four fake
  CPU devices (where interpret-mode Pallas cannot run under a mesh: XLA
  attention, which has no parameters either). The TPU run is also the data
  mesh's compile: its report must show all-reduced gradients and no
  gathers, three kernels per unrolled layer, and a total that adds up."""
  tpu = _cli(f"--topology={SLICE}", "--config.model.attention_impl=pallas")
  cpu = _cli("--num_fake_devices=4", "--config.model.attention_impl=xla")
  tpu_out, tpu_bytes = _finish(tpu)
  cpu_out, cpu_bytes = _finish(cpu)
  assert tpu_out.startswith(
      "Train step (masked_lm) compiled ahead of time by the TPU compiler "
      f"for 4 TPU v5 lite chips (topology {SLICE}), mesh data=4, fsdp=1, "
      "tensor=1.\n")
  assert re.search(r"^  total per chip +[0-9.]+ +arguments \+ outputs - "
                   r"aliased \+ temporaries \[TPU compiler\]$", tpu_out, re.M)
  n = CLI_LAYERS  # each unrolled layer runs the three kernels
  assert re.search(rf"^Mosaic kernels per step: {3 * n} \(albert_flash_bwd_"
                   rf"dkv {n}, albert_flash_bwd_dq {n}, albert_flash_fwd "
                   rf"{n}\)$", tpu_out, re.M)
  # A data mesh: the state is replicated, the gradients all-reduced.
  collectives = re.search(r"^Collectives per step \(count, output bytes "
                          r"per device\): (.*)\.$", tpu_out, re.M)
  counts = {op: int(c) for op, c in re.findall(r"([a-z-]+) (\d+) \(",
                                                collectives.group(1))}
  assert counts["all-reduce"] > 0 and counts["all-gather"] == 0, counts
  assert tpu_bytes["total"] == (
      tpu_bytes["arguments"] + tpu_bytes["outputs"] - tpu_bytes["aliased"]
      + tpu_bytes["temporaries"])
  assert re.search(r"^    matmuls [0-9.e+]+ \(1\.000x analytic without "
                   r"attention\), attention kernels [0-9.e+]+ \(1\.500x "
                   r"analytic attention\)$", tpu_out, re.M)
  assert "temporaries [XLA:CPU estimate]" in cpu_out
  for key in ("state", "params", "optimizer", "batch"):
    assert tpu_bytes[key] == cpu_bytes[key], key
  # ALBERT-base's 11.7M parameters and two LAMB moments, float32.
  assert tpu_bytes["params"] == 47255240
