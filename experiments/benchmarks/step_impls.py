"""The implementations train_step.py and compile_time.py time.

albert_jax's train step built as the trainer builds it (`JaxRunner`, with
the `step_fixes` variant a `--fix` or `--unfix` asks for), and transformers'
`AlbertForPreTraining` trained with torch (`HFRunner`), both on one
synthetic pre-training batch (`make_batch`); and the machine description
every result carries (`machine_info`).
"""

import contextlib
import datetime
import os
import platform
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import config_lib
from albert_jax import sharding as sharding_lib
from albert_jax.data import loader as loader_lib
from albert_jax.model import flops as flops_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import optimizer as optim
from albert_jax.training import run_spec
from albert_jax.training import state as state_lib
from albert_jax.training import step as step_lib

import step_fixes  # pylint: disable=g-bad-import-order  # isort: skip

IMPLS = ("jax_adamw", "jax_lamb", "hf_eager", "hf_compile")
LABELS = {"jax_adamw": "albert_jax AdamW", "jax_lamb": "albert_jax LAMB",
          "hf_eager": "HF eager", "hf_compile": "HF torch.compile"}
# The ids of ALBERT's SentencePiece vocabulary.
CLS_ID, SEP_ID, MASK_ID, FIRST_WORD_ID = 2, 3, 4, 5


################################################################################
# Shapes, batch, FLOPs.
################################################################################


def model_section(size: str, seq: int):
  """The ConfigDict model section of an ALBERT size."""
  if size == "tiny":
    return config_lib.tiny_model(max_position_embeddings=max(128, seq))
  return config_lib.albert_model(size)


def make_batch(cfg: ModelConfig, batch: int, seq: int, predictions: int,
               seed: int = 0) -> dict[str, np.ndarray]:
  """A pre-training batch in albert_jax's layout, plus HF's `labels`.

  Returns input_ids, token_type_ids, attention_mask [B, T];
  masked_positions, masked_ids, masked_weights [B, P]; sentence_labels [B];
  labels [B, T] (the original ids at the masked positions, -100 elsewhere).
  """
  if not 4 <= seq <= cfg.max_length:
    raise ValueError(f"--seqs {seq}: needs 4 <= seq <= {cfg.max_length}.")
  if not 1 <= predictions <= seq - 3:
    raise ValueError(f"--predictions {predictions} must be in [1, seq - 3] "
                     f"= [1, {seq - 3}] (three positions are special).")
  rng = np.random.default_rng(seed)
  ids = rng.integers(FIRST_WORD_ID, cfg.vocab_size, (batch, seq),
                     dtype=np.int32)
  mid = seq // 2
  ids[:, 0], ids[:, mid], ids[:, -1] = CLS_ID, SEP_ID, SEP_ID
  types = np.zeros((batch, seq), np.int32)
  types[:, mid + 1:] = 1
  words = np.setdiff1d(np.arange(seq), [0, mid, seq - 1])
  positions = np.sort(np.stack([rng.choice(words, predictions, replace=False)
                                for _ in range(batch)]), axis=1)
  positions = positions.astype(np.int32)
  rows = np.arange(batch)[:, None]
  masked_ids = ids[rows, positions]
  labels = np.full((batch, seq), -100, np.int64)
  labels[rows, positions] = masked_ids
  ids[rows, positions] = MASK_ID
  return {
      "input_ids": ids, "token_type_ids": types,
      "attention_mask": np.ones((batch, seq), np.int32),
      "masked_positions": positions, "masked_ids": masked_ids,
      "masked_weights": np.ones((batch, predictions), np.float32),
      "sentence_labels": rng.integers(0, 2, (batch,), dtype=np.int32),
      "labels": labels,
  }


def step_flops(cfg: ModelConfig, batch: int, seq: int,
               predictions: int | None) -> int:
  """Training FLOPs of one step; predictions=None decodes all T positions."""
  return flops_lib.training_flops_per_step(cfg, batch, seq, predictions)


################################################################################
# The implementations.
################################################################################


class JaxRunner:
  """albert_jax's train step, built as `albert_jax.training.pretrain`
  builds it."""

  def __init__(self, size, seq, batch_np, optimizer, dtype, variant="",
               compiler_options=None):
    """`variant`: "" for the library as it is, or a `step_fixes.variant`
    spec ("+fix", "-unfix", joined) applied while the step is traced."""
    section = model_section(size, seq)
    section.dtype = dtype
    patches = []
    for overrides, patch in step_fixes.changes(variant) if variant else []:
      patches.append(patch)
      for key, value in overrides.items():
        section[key] = value
    batch_size, predictions = batch_np["masked_ids"].shape
    config = config_lib.base_config(
        section, optimizer=optimizer, batch_size=batch_size,
        max_seq_length=seq, max_predictions=predictions)
    self.config = config
    spec = run_spec.run_spec(config)
    self.model_config = spec.model_config
    tx, schedule = optim.make(config.optimizer, config.num_train_steps)
    self.compiler_options = compiler_options
    self.mesh, self.rules = sharding_lib.mesh_and_rules(
        config.mesh, config.sharding_rules)
    start = time.perf_counter()
    self.state, shardings = state_lib.create_state(
        state_lib.state_init_fn(spec.init_params, tx), tx, self.mesh,
        self.rules, jax.random.key(config.seed), compiler_options)
    jax.block_until_ready(self.state)
    self.init_seconds = time.perf_counter() - start
    self.batch = jax.device_put(
        {k: batch_np[k] for k in loader_lib.BATCH_KEYS},
        sharding_lib.data_sharding(self.mesh))
    step = step_lib.jit_train_step(
        step_lib.make_train_step(spec.objective, tx, schedule), shardings,
        self.mesh, self.rules)
    # Lowered and compiled ahead of time so that compile time is measured on
    # its own and a patch is in force exactly while the step is traced.
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
      for patch in patches:
        stack.enter_context(patch())
      self.compiled = step.lower(self.state, self.batch).compile(
          compiler_options=compiler_options)
    self.first_seconds = time.perf_counter() - start
    self.metrics = None

  def launch(self):
    """Dispatches one step without waiting for it."""
    with jax.set_mesh(self.mesh):
      self.state, self.metrics = self.compiled(self.state, self.batch)

  def sync(self):
    jax.block_until_ready((self.state, self.metrics))

  def step(self):
    self.launch()
    self.sync()

  def loss(self) -> float:
    return float(self.metrics["loss"])


def hf_albert_config(cfg: ModelConfig, attn: str = "sdpa"):
  """transformers.AlbertConfig with `cfg`'s hyperparameters.

  share="all" maps onto HF's groups as is; share="none" becomes one group per
  layer (HF's way of unshared layers). HF has no partial sharing and always
  has the E→H projection.
  """
  import transformers  # pylint: disable=g-import-not-at-top
  if cfg.share not in ("all", "none") or not cfg.embedding_projection:
    raise ValueError(
        f"HF's ALBERT has no model.share={cfg.share!r} or model without the "
        "E→H projection; use share='all' or 'none' with the projection.")
  if cfg.share == "none" and cfg.inner_group_num != 1:
    raise ValueError("share='none' with inner_group_num > 1 has no HF "
                     "equivalent; set model.inner_group_num=1.")
  groups = (cfg.num_hidden_groups if cfg.share == "all"
            else cfg.num_hidden_layers)
  fields = ("vocab_size", "embedding_size", "hidden_size",
            "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "inner_group_num", "hidden_act", "hidden_dropout_prob",
            "attention_probs_dropout_prob", "max_position_embeddings",
            "type_vocab_size", "initializer_range", "layer_norm_eps",
            "classifier_dropout_prob")
  values = {f: getattr(cfg, f) for f in fields}
  return transformers.AlbertConfig(num_hidden_groups=groups,
                                   attn_implementation=attn, **values)


def hf_inputs(batch_np: dict[str, np.ndarray], device: str) -> dict:
  """`make_batch`'s arrays as AlbertForPreTraining's keyword arguments."""
  import torch  # pylint: disable=g-import-not-at-top
  names = {"input_ids": "input_ids", "token_type_ids": "token_type_ids",
           "attention_mask": "attention_mask", "labels": "labels",
           "sentence_order_label": "sentence_labels"}
  return {hf: torch.from_numpy(batch_np[ours].astype(np.int64)).to(device)
          for hf, ours in names.items()}


class HFRunner:
  """transformers' AlbertForPreTraining, one optimizer step per `step()`.

  The model's dropout rates are `cfg`'s (none for ALBERT v2); HF's SOP head
  also applies `classifier_dropout_prob` (0.1) to the [B, H] pooled output,
  which albert_jax's pre-training head does not: a negligible extra.
  """

  def __init__(self, cfg: ModelConfig, train_config, batch_np, device: str,
               autocast: bool, compile_model: bool, attn: str = "sdpa"):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self.torch = torch
    torch.manual_seed(train_config.seed)
    model = transformers.AlbertForPreTraining(hf_albert_config(cfg, attn))
    self.model = model.to(device).train()
    o = train_config.optimizer
    decay, no_decay = [], []
    for name, p in self.model.named_parameters():
      # HF names LayerNorm "LayerNorm"; optim.EXCLUDE_PATTERN covers it.
      excluded = any(s in name for s in ("LayerNorm", "layer_norm", "bias"))
      (no_decay if excluded else decay).append(p)
    self.optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps, fused=True)
    schedule = optim.albert_schedule(
        o.learning_rate, train_config.num_train_steps, o.warmup_steps,
        o.end_learning_rate, o.power)
    factors = np.asarray(jax.jit(jax.vmap(schedule))(
        jnp.arange(train_config.num_train_steps + 1))) / o.learning_rate
    self.scheduler = torch.optim.lr_scheduler.LambdaLR(
        self.optimizer,
        lambda s: float(factors[min(s, len(factors) - 1)]))
    self.clip = o.clip_norm
    self.forward = torch.compile(self.model) if compile_model else self.model
    self.device = device
    self.autocast = autocast
    self.inputs = hf_inputs(batch_np, device)
    self.last_loss = None
    start = time.perf_counter()
    self.step()
    self.first_seconds = time.perf_counter() - start

  def launch(self):
    """Queues one step's kernels; returns once Python has issued them."""
    torch = self.torch
    with torch.autocast(device_type=self.device, dtype=torch.bfloat16,
                        enabled=self.autocast):
      out = self.forward(**self.inputs)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
    self.optimizer.step()
    self.scheduler.step()
    self.optimizer.zero_grad(set_to_none=True)
    self.last_loss = out.loss.detach()

  def sync(self):
    if self.device == "cuda":
      self.torch.cuda.synchronize()

  def step(self):
    self.launch()
    self.sync()

  def loss(self) -> float:
    return float(self.last_loss)


################################################################################
# Where a result came from.
################################################################################


def cpu_model() -> str:
  """The CPU's model name from /proc/cpuinfo."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def machine_info(threads: int) -> dict:
  """Date, CPU, load, devices and versions, for every result."""
  info = {
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "cpu": cpu_model(), "cpus": os.cpu_count(), "threads": threads,
      "load_average": os.getloadavg(),
      "jax_device": jax.devices()[0].device_kind,
      "python": platform.python_version(), "jax": jax.__version__,
  }
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    info.update(torch=torch.__version__, transformers=transformers.__version__)
  except ImportError:
    pass
  try:
    info["git"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True,
        text=True, check=True, cwd=os.path.dirname(__file__)).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    pass
  return info
