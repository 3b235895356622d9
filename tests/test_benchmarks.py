"""The train-step and compile-time benchmarks: same job, and they run.

The scripts in experiments/benchmarks/ are not part of the library; these
tests check what their numbers rest on (albert_jax and transformers get the
same batch and compute the same loss, the HF model has the same parameters,
the before/after variants switch what they say and the candidates compute
the same loss) and smoke-run each script with
its smallest flags in a subprocess; the memory table is remade from its
records.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
from locations import EXPERIMENTS
from locations import REPO
import numpy as np
import pytest

from albert_jax.data.loader import BATCH_KEYS
from albert_jax.interop import hf
from albert_jax.model import albert as albert_lib
from albert_jax.model import layers
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives

BENCH = EXPERIMENTS / "benchmarks"
sys.path.insert(0, str(BENCH))
# pylint: disable=g-import-not-at-top,wrong-import-position
import memory_table  # noqa: E402
import step_fixes  # noqa: E402
import step_impls  # noqa: E402
import step_profile  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny(share="all", seq=32):
  section = step_impls.model_section("tiny", seq)
  section.share = share
  return ModelConfig.from_dict(section)


def test_batch_masks_the_predicted_positions_and_labels_them():
  cfg = tiny()
  b = step_impls.make_batch(cfg, batch=3, seq=32, predictions=5, seed=1)
  rows = np.arange(3)[:, None]
  pos = b["masked_positions"]
  assert np.all(np.diff(pos, axis=1) > 0)  # distinct, sorted
  assert not np.isin(pos, [0, 16, 31]).any()  # never [CLS] or [SEP]
  assert np.all(b["input_ids"][rows, pos] == step_impls.MASK_ID)
  assert np.all(b["labels"][rows, pos] == b["masked_ids"])
  assert np.sum(b["labels"] != -100) == 3 * 5
  assert np.all(b["masked_ids"] >= step_impls.FIRST_WORD_ID)
  assert np.all(b["token_type_ids"][:, :17] == 0)
  assert np.all(b["token_type_ids"][:, 17:] == 1)


@pytest.mark.parametrize("share", ["all", "none"])
def test_hf_model_has_the_same_parameters(share):
  cfg = tiny(share)
  model = transformers.AlbertForPreTraining(step_impls.hf_albert_config(cfg))
  hf_count = sum(p.numel() for p in model.parameters())
  ids = jnp.zeros((1, 8), jnp.int32)
  params = jax.eval_shape(lambda: albert_lib.Albert(cfg).init(
      jax.random.key(0), ids, masked_positions=jnp.zeros((1, 2), jnp.int32)))
  ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  assert hf_count == ours


def test_hf_and_albert_jax_compute_the_same_loss_on_the_batch():
  """Same weights, same batch: HF's labels/-100 loss equals ours."""
  cfg = tiny()
  batch = step_impls.make_batch(cfg, batch=2, seq=32, predictions=4)
  torch.manual_seed(0)
  model = transformers.AlbertForPreTraining(
      step_impls.hf_albert_config(cfg)).eval()
  with torch.no_grad():
    hf_loss = float(model(**step_impls.hf_inputs(batch, "cpu")).loss)
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  params, _ = hf.params_from_hf(state, cfg)
  objective = objectives.MaskedLMObjective(albert_lib.Albert(cfg))
  jbatch = {k: jnp.asarray(batch[k]) for k in BATCH_KEYS}
  sums = jax.jit(lambda p, b: objective.sums(p, b, None, True))(params,
                                                               jbatch)
  dens = objective.denominators(jbatch)
  ours = sum(float(sums[f"{t}_loss_sum"] / d) for t, d in dens.items())
  # The official 1e-5 in the MLM denominator is the only difference.
  np.testing.assert_allclose(ours, hf_loss, rtol=1e-5)


def test_variant_specs_name_fixes_and_unfixes():
  assert step_fixes.variant("-dense_vjp-gelu_jvp") == [("-", "dense_vjp"),
                                                       ("-", "gelu_jvp")]
  assert step_fixes.variant("+fused_qkv") == [("+", "fused_qkv")]
  for bad in ("fused_qkv", "+dense_vjp", "-fused_qkv", "+nope", "+"):
    with pytest.raises(ValueError):
      step_fixes.variant(bad)


def test_unfixes_switch_the_library_changes_off():
  """-dense_vjp gives back autodiff's einsum (no barrier before the weight
  gradient), -gelu_jvp the GELU without the custom rule."""
  dense = layers.Dense((8,), ("embed", "mlp"))
  x = jnp.ones((2, 3, 4))
  params = dense.init(jax.random.key(0), x)

  def grad_text():
    return str(jax.make_jaxpr(jax.grad(
        lambda p: jnp.sum(jax.nn.gelu(dense.apply(p, x)))))(params))

  def gelu_text():
    return str(jax.make_jaxpr(lambda v: layers.activation("gelu_new")(v))(
        1.0))

  assert "optimization_barrier" in grad_text()
  assert "custom_jvp_call" in gelu_text()
  with step_fixes.plain_dense():
    assert "optimization_barrier" not in grad_text()
  with step_fixes.autodiff_gelu():
    assert "custom_jvp_call" not in gelu_text()
  assert "optimization_barrier" in grad_text()  # restored
  assert "custom_jvp_call" in gelu_text()


@pytest.mark.parametrize("spec", ["+fused_qkv", "+dw_swap", "-attn_rows",
                                  "-ffn_act_remat", "-key_bias"])
def test_variants_compute_the_same_loss_and_gradients(spec, fast_compile):
  """A candidate, or a library change switched off, is timed on the
  library's parameters: same tree, same loss and gradients (to float32
  rounding), padding included."""
  cfg = tiny(seq=16)
  batch = step_impls.make_batch(cfg, batch=2, seq=16, predictions=3)
  batch["attention_mask"][1, -4:] = 0  # padding queries and keys
  model = albert_lib.Albert(cfg)
  objective = objectives.MaskedLMObjective(model)
  jbatch = {k: jnp.asarray(batch[k]) for k in BATCH_KEYS}
  init = lambda: model.init(  # noqa: E731
      jax.random.key(0), jbatch["input_ids"],
      masked_positions=jbatch["masked_positions"])["params"]
  params = jax.jit(init, compiler_options=fast_compile)()
  loss = jax.value_and_grad(
      lambda p: objective.sums(p, jbatch, None, True)["mlm_loss_sum"])
  want, want_grads = jax.jit(loss, compiler_options=fast_compile)(params)
  [(_, patch)] = step_fixes.changes(spec)
  with patch():
    assert jax.tree.structure(jax.eval_shape(init)) == jax.tree.structure(
        params)
    got, grads = jax.jit(loss, compiler_options=fast_compile)(params)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # Gradients that are zero in exact arithmetic (the key bias's) are
  # rounding noise: compare on the scale of the largest.
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
  for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.parametrize("op_name, expected", [
    ("jit(step)/jvp(Albert)/encoder/while/body/closed_call/layers/FFNBlock/"
     "intermediate/...a,aw->...w/dot_general", ("forward", "FFN matmuls")),
    ("jit(step)/transpose(jvp(Albert))/encoder/while/body/closed_call/layers/"
     "AttentionBlock/layer_norm/mul", ("backward", "LayerNorm")),
    ("jit(step)/transpose(jvp(Albert))/encoder/while/body/closed_call/layers/"
     "AttentionBlock/bqhd,bkhd->bhqk/dot_general",
     ("backward", "attention scores, mask, softmax, context")),
    ("jit(step)/jvp(Albert)/encoder/while/body/jit(dynamic_update_index_in_"
     "dim)/dynamic_update_slice", ("forward", "layer scan bookkeeping")),
    ("jit(step)/jvp()/reduce_sum",
     ("forward", "losses (cross-entropy) and the rest")),
    ("jit(step)/mul", ("other",
                       "optimizer, clipping, non-finite guard, metrics")),
    ("jit(step)/optimizer/mul", ("other", "optimizer and gradient clipping")),
    ("jit(step)/nonfinite_guard/reduce_or", ("other", "non-finite guard")),
    ("jit(step)/step_metrics/sqrt", ("other", "metrics")),
    ("", ("other", "XLA-inserted copies (no op metadata)")),
])
def test_profile_classifies_ops_by_their_name_stack(op_name, expected):
  assert step_profile.classify("copy.3", op_name) == expected


def test_hlo_op_names_reads_instruction_metadata():
  text = ("  %ynn_fusion.3 = f32[8]{0} fusion(%p), kind=kCustom, "
          'metadata={op_name="jit(step)/jvp(Albert)/x" stack_frame_id=2}\n'
          "  ROOT %copy.1 = f32[8]{0} copy(%ynn_fusion.3)\n")
  assert step_profile.hlo_op_names(text) == {
      "ynn_fusion.3": "jit(step)/jvp(Albert)/x", "copy.1": ""}


def run_script(name, *flags, tmp_path):
  out = tmp_path / "out.json"
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
      [sys.executable, str(BENCH / name), *flags, "--json", str(out)],
      capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
      check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out, encoding="utf-8") as f:
    return proc.stdout, json.load(f)


@pytest.mark.long
def test_train_step_script_prints_every_row_and_a_profile(tmp_path):
  stdout, result = run_script(
      "train_step.py", "--sizes", "tiny", "--seqs", "16", "--batch", "2",
      "--predictions", "2", "--steps", "1", "--warmup", "0",
      "--impls", "jax_adamw,hf_eager", "--unfix", "dense_vjp+gelu_jvp",
      "--xla", "xla_cpu_use_fusion_emitters=false,xla_backend_optimization_level=1",
      "--threads", "1", "--fast_compile", "--profile", str(tmp_path / "trace"),
      "--profile_steps", "1", tmp_path=tmp_path)
  table = [l for l in stdout.splitlines() if l.startswith("| tiny | 16 | 2 |")]
  assert [l.split(" | ")[3] for l in table] == [
      "albert_jax AdamW", "albert_jax AdamW -dense_vjp-gelu_jvp",
      "albert_jax AdamW xla_cpu_use_fusion_emitters=false,"
      "xla_backend_optimization_level=1", "HF eager (sdpa)"]
  # HF eager against itself, waiting on each step (blocking) and not.
  assert re.search(r"\| 1\.00x \| — \| [\d.]+ \| — \|$", table[3])
  assert [r["impl"] for r in result["rows"]] == [
      "jax_adamw", "jax_adamw-dense_vjp-gelu_jvp",
      "jax_adamw xla_cpu_use_fusion_emitters=false,"
      "xla_backend_optimization_level=1", "hf_eager"]
  for row in result["rows"]:
    assert row["step_seconds"] > 0 and row["sequences_per_second"] > 0
    assert len(row["pipelined"]) == 3 and row["pipelined_seconds"] > 0
  ours, before, options, hf_row = result["rows"]
  # The row's options on top of --fast_compile's, as compiled.
  assert options["xla_options"] == {
      **ours["xla_options"], "xla_cpu_use_fusion_emitters": False,
      "xla_backend_optimization_level": 1}
  # The same step, before and after the library's changes.
  assert before["job_flops_per_step"] == ours["job_flops_per_step"]
  # The same job for both; HF's head decodes all 16 positions, not 2.
  assert ours["job_flops_per_step"] == hf_row["job_flops_per_step"]
  assert ours["executed_flops_per_step"] == ours["job_flops_per_step"]
  assert hf_row["executed_flops_per_step"] > hf_row["job_flops_per_step"]
  assert "\nProfile: tiny seq 16 batch 2 albert_jax AdamW." in stdout
  assert "| FFN matmuls |" in stdout
  profile = result["profiles"][0]  # one per albert_jax row
  assert len(result["profiles"]) == 3
  assert profile["components"]["FFN matmuls"]["forward"] > 0
  assert profile["components"]["FFN matmuls"]["backward"] > 0


@pytest.mark.long
def test_compile_time_script_prints_every_row(tmp_path):
  stdout, result = run_script(
      "compile_time.py", "--width", "tiny", "--depths", "1,2", "--shares",
      "none", "--seq", "16", "--batch", "2", "--predictions", "2",
      "--fast_compile", "--no_warmup", tmp_path=tmp_path)
  table = [l for l in stdout.splitlines() if l.startswith("| tiny |")]
  assert [tuple(l.split(" | ")[1:3]) for l in table] == [("none", "1"),
                                                          ("none", "2")]
  one, two = result["rows"]
  assert one["vs_fewest"] == 1.0
  assert two["vs_fewest"] == two["step_total_s"] / one["step_total_s"]
  # Unshared layers store one parameter set per layer.
  cfg = tiny("none")
  params = jax.eval_shape(lambda: albert_lib.Albert(cfg).init(
      jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))["params"]["encoder"]
  stacks = jax.tree.leaves([params["attention"], params["ffn"]])
  per_layer = sum(int(np.prod(x.shape)) for x in stacks) // cfg.num_steps
  assert two["params"] - one["params"] == per_layer


def memory_table_script(*flags):
  return subprocess.run(
      [sys.executable, str(BENCH / "memory_table.py"), *flags],
      capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(
          REPO)}, cwd=REPO, timeout=300, check=False)


def test_memory_table_remakes_the_committed_table_from_its_records(
    tmp_path):
  """experiments/memory_table.md is what its records and command make."""
  committed = EXPERIMENTS / "memory_table.md"
  markdown = tmp_path / "memory_table.md"
  shutil.copy(committed, markdown)  # for its notes
  proc = memory_table_script(
      "--compiler", "tpu", "--render_only", "--markdown", str(markdown),
      "--date", "2026-11-26", "--machine", "AMD EPYC, 2 cores",
      # What made the records, before this script took in that one.
      "--command", "python experiments/benchmarks/tpu_memory_table.py "
      "--meshes data,fsdp --accumulation 1,2,4,8 --markdown "
      "experiments/memory_table.md")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert markdown.read_bytes() == committed.read_bytes()


def test_memory_table_keeps_the_cpu_estimate_off_the_tpu_table(tmp_path):
  markdown = tmp_path / "memory_table.md"
  shutil.copy(EXPERIMENTS / "memory_table.md", markdown)
  before = markdown.read_bytes()
  proc = memory_table_script("--compiler", "cpu", "--render_only",
                             "--markdown", str(markdown))
  assert proc.returncode != 0
  assert "holds the tpu compiler's table" in proc.stderr
  assert markdown.read_bytes() == before


@pytest.mark.long
def test_memory_table_compiles_a_cpu_case_and_resumes(tmp_path):
  """One XLA:CPU compile; accumulation 2 is skipped once 1 fits."""
  out, markdown = tmp_path / "records.jsonl", tmp_path / "table.md"
  flags = ("--compiler", "cpu", "--devices", "32", "--models", "base",
           "--meshes", "fsdp", "--remat", "full", "--accumulation", "1,2",
           "--skip_after_fit", "--out", str(out), "--markdown", str(markdown))
  proc = memory_table_script(*flags)
  assert proc.returncode == 0, proc.stderr[-3000:]
  [record] = [json.loads(l) for l in out.read_text().splitlines()]
  assert record["status"] == "ok", record
  assert (record["devices"], record["accumulation"]) == (32, 1)
  assert record["mesh_shape"] == {"data": 1, "fsdp": 32, "tensor": 1}
  total = record["total"] / memory_table.GIB
  assert f"| base | fsdp | full | 0.05 | {total:.2f} ✓ | – |" in (
      markdown.read_text())
  # Run again: accumulation 1 is done and 2 still skipped, the same table.
  table = markdown.read_text()
  proc = memory_table_script(*flags)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert " ok: " not in proc.stdout
  assert len(out.read_text().splitlines()) == 1
  assert markdown.read_text() == table


def test_memory_table_records_a_compile_that_takes_too_long(monkeypatch):
  monkeypatch.setattr(memory_table, "STARTUP_SECONDS", 0)
  case = {"model": "base", "devices": 32, "mesh": "fsdp", "remat": "full",
          "accumulation": 1}
  records, lines = {}, []

  class Out:
    def write(self, text):
      lines.append(text)

    def flush(self):
      pass

  memory_table.compile_cases(memory_table.CPU, [case], records, Out(),
                             timeout=0.5, skip_after_fit=True,
                             log=lambda _: None)
  record = json.loads(lines[0])
  assert record == {**case, "status": "timeout",
                    "error": "no result within 0 s"}
  assert records == {"base/32/fsdp/full/1": record}


def test_tile_sweep_candidates_differ_and_lower_for_cuda(capsys):
  """flash_gpu_blocks.py: the defaults first, every other candidate a
  distinct BlockSizes changing one kernel's tiles, and --lower_only lowers
  the forward candidates for CUDA (exit 0, one "lowers" line each)."""
  import flash_gpu_blocks  # pylint: disable=g-import-not-at-top
  from albert_jax.ops import flash_gpu  # pylint: disable=g-import-not-at-top
  found = list(flash_gpu_blocks.candidates())
  assert found[0] == ("default", flash_gpu.BlockSizes())
  assert len({sizes for _, sizes in found}) == len(found) == 23
  default = flash_gpu.BlockSizes()
  for kind, sizes in found[1:]:
    changed = {k for k, v in vars(sizes).items() if getattr(default, k) != v}
    assert changed and all(("dq" in k or "dkv" in k) == (kind == "bwd")
                           for k in changed), (kind, changed)
  assert flash_gpu_blocks.main(["--lower_only", "--seqs", "256",
                                "--kinds", "fwd", "--tokens", "512"]) == 0
  assert capsys.readouterr().out.count(": lowers") == 8
