"""The model's hyperparameters as a frozen, validated dataclass.

Configs on the command line are ml-collections `ConfigDict`s; the model takes
this plain dataclass (`ModelConfig(**config.model)`) so that the model module
has no dependency beyond JAX and Flax, and so that a bad value is refused with
a message before anything is traced. Field names follow HF transformers'
`AlbertConfig`, so a user moving from there recognises every one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from albert_jax import hints

SHARE_MODES = ("all", "attention", "ffn", "none")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
LAYER_LOOPS = ("auto", "scan", "unroll")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
           "float16": jnp.float16}
# What a run may train in (`config.model.dtype`): float16 needs loss
# scaling, which the trainer does not do.
TRAINING_DTYPES = ("float32", "bfloat16")


# Upper bounds on every size, far above any published model (vocabularies
# of 256k, hidden 16k, 128 layers, 128k positions), so a mistyped or crafted
# config (config.json's vocab_size=10**12, a depth of millions) is refused
# before anything is built or allocated.
SIZE_LIMITS = {
    "vocab_size": 1 << 22, "embedding_size": 1 << 16, "hidden_size": 1 << 16,
    "num_hidden_layers": 1 << 10, "num_attention_heads": 1 << 10,
    "intermediate_size": 1 << 18, "num_hidden_groups": 1 << 10,
    "inner_group_num": 1 << 6, "max_position_embeddings": 1 << 20,
    "type_vocab_size": 1 << 10, "num_sentence_labels": 1 << 10}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """ALBERT / BERT encoder hyperparameters.

  Attributes:
    share: which layer parameters are shared across depth (paper Table 4):
      "all" (ALBERT), "attention", "ffn", or "none" (BERT). Shared parameters
      follow the official group mapping (`num_hidden_groups`,
      `inner_group_num`); unshared ones get one copy per applied layer.
    embedding_projection: ALBERT's E→H `embedding_hidden_mapping_in`. BERT
      has none and needs `embedding_size == hidden_size`.
    mlm_hidden_act: the MLM head's activation; "" uses `hidden_act` (ALBERT,
      BERT), while RoBERTa's and ELECTRA's generator heads fix it to "gelu".
    position_ids_from_padding: RoBERTa's default positions: a token's
      position is `pad_token_id` + its 1-based index among the non-pad tokens
      (`input_ids != pad_token_id`), and pad tokens sit at `pad_token_id`.
      Otherwise positions count 0..T-1.
    pad_token_id: the padding token, used by `position_ids_from_padding`.
    dtype: compute dtype; parameters stay in `param_dtype`.
    remat: rematerialisation policy of each layer in the scan.
    layer_loop: how the encoder walks its layers: "scan" (one `nn.scan`:
      compile time flat in depth), "unroll" (the same scan unrolled: each
      layer's activations are its own buffers rather than slices of
      stacked [layers, ...] arrays, which on GPU the scan zero-fills,
      copies into and copies out of), or "auto": unrolled on GPU and TPU,
      scanned on CPU and wherever `remat` is set, which needs the loop
      (`encoder.unrolls_layers`). Same parameters and values either way.
    initializer: how weight matrices and embedding tables start, each of
      scale `initializer_range` (`layers.kernel_init`): "truncated_normal"
      (the official code's, redrawn beyond 2σ: deviation 0.88 ×
      initializer_range) or "normal" (transformers', for runs compared
      with transformers' from scratch). REPRODUCTION.md, "Sentence order
      on the counting corpus", has what was measured with each.
    causal: left-to-right attention (GPT-1): a token attends only to itself
      and earlier tokens of its segment, and the pooler reads the last
      non-padding token instead of position 0.
  """
  vocab_size: int = 30000
  embedding_size: int = 128
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  num_hidden_groups: int = 1
  inner_group_num: int = 1
  hidden_act: str = "gelu_new"
  hidden_dropout_prob: float = 0.0
  attention_probs_dropout_prob: float = 0.0
  classifier_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  initializer_range: float = 0.02
  initializer: str = "truncated_normal"
  layer_norm_eps: float = 1e-12
  share: str = "all"
  embedding_projection: bool = True
  mlm_hidden_act: str = ""
  position_ids_from_padding: bool = False
  pad_token_id: int = 0
  num_sentence_labels: int = 2
  dtype: str = "float32"
  param_dtype: str = "float32"
  attention_impl: str = "auto"
  remat: str = "none"
  layer_loop: str = "auto"
  causal: bool = False

  def __post_init__(self):
    def fail(msg):
      raise ValueError(f"Invalid model config: {msg}")
    for name in ("vocab_size", "embedding_size", "hidden_size",
                 "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "num_hidden_groups", "inner_group_num",
                 "max_position_embeddings", "type_vocab_size",
                 "num_sentence_labels"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        fail(f"model.{name} must be a positive integer, got {value!r}.")
      if value > SIZE_LIMITS[name]:
        fail(f"model.{name}={value} is more than albert_jax builds (at most "
             f"{SIZE_LIMITS[name]}); a config (or config.json) this large "
             "is mistyped or damaged.")
    if self.hidden_size % self.num_attention_heads:
      fail(f"model.hidden_size ({self.hidden_size}) must be divisible by "
           f"model.num_attention_heads ({self.num_attention_heads}).")
    if self.share not in SHARE_MODES:
      fail(f"model.share={self.share!r}; choose one of {SHARE_MODES}.")
    if self.num_hidden_groups > self.num_hidden_layers:
      fail(f"model.num_hidden_groups ({self.num_hidden_groups}) exceeds "
           f"model.num_hidden_layers ({self.num_hidden_layers}).")
    if self.share == "none" and self.num_hidden_groups != 1:
      fail("model.share='none' gives every layer its own parameters, so "
           "model.num_hidden_groups must be 1 (groups only apply to shared "
           "parameters).")
    if not self.embedding_projection and (
        self.embedding_size != self.hidden_size):
      fail(f"model.embedding_projection=False needs model.embedding_size "
           f"({self.embedding_size}) equal to model.hidden_size "
           f"({self.hidden_size}); set model.embedding_projection=True for "
           "a factorised (ALBERT) embedding.")
    if (not isinstance(self.pad_token_id, int)
        or isinstance(self.pad_token_id, bool)
        or not 0 <= self.pad_token_id < self.vocab_size):
      fail(f"model.pad_token_id must be an id in [0, vocab_size="
           f"{self.vocab_size}), got {self.pad_token_id!r}.")
    if (self.position_ids_from_padding
        and self.pad_token_id + 1 >= self.max_position_embeddings):
      fail(f"model.position_ids_from_padding starts positions at "
           f"pad_token_id + 1 = {self.pad_token_id + 1}, which leaves no "
           f"room in max_position_embeddings="
           f"{self.max_position_embeddings}.")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        fail(f"model.{name}={getattr(self, name)!r}; choose one of "
             f"{sorted(_DTYPES)}.")
    if not isinstance(self.causal, bool):
      fail(f"model.causal must be true or false, got {self.causal!r}.")
    if self.remat not in REMAT_POLICIES:
      fail(f"model.remat={self.remat!r}; choose one of {REMAT_POLICIES}.")
    if self.layer_loop not in LAYER_LOOPS:
      fail(f"model.layer_loop={self.layer_loop!r}; choose one of "
           f"{LAYER_LOOPS}.")
    if self.layer_loop == "unroll" and self.remat != "none":
      fail(f"model.remat={self.remat!r} with model.layer_loop='unroll' "
           "saves no memory: unrolled, XLA recomputes each layer beside its "
           "forward pass and keeps every activation anyway. Use "
           "model.layer_loop='auto' (it keeps the loop when remat is set) or "
           "'scan', or model.remat='none'.")
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob",
                 "classifier_dropout_prob"):
      if not 0.0 <= getattr(self, name) < 1.0:
        fail(f"model.{name} must be in [0, 1), got {getattr(self, name)}.")
    # Checked here so a typo fails at config time, not at the first trace.
    from albert_jax.model import layers  # pylint: disable=g-import-not-at-top
    from albert_jax.ops import attention  # pylint: disable=g-import-not-at-top
    for name in ("hidden_act", "mlm_hidden_act"):
      act = getattr(self, name)
      if name == "hidden_act" or act:  # "" for the MLM head: hidden_act's
        try:
          layers.activation(act)
        except ValueError as e:
          fail(f"model.{name}={act!r}: {e}")
    if self.initializer not in layers.INITIALIZERS:
      fail(f"model.initializer={self.initializer!r}; choose one of "
           f"{layers.INITIALIZERS}.")
    if self.attention_impl not in attention.IMPLEMENTATIONS:
      fail(f"model.attention_impl={self.attention_impl!r}; choose one of "
           f"{attention.IMPLEMENTATIONS}.")

  def check_heads(self, heads) -> None:
    """Refuses pre-training heads this model cannot train (ValueError).

    A causal model cannot have the "sop" head: its instances put segment B
    before A (SOP) or after a random document (NSP) half of the time, and a
    left-to-right model trained on them would learn that shuffled text as
    real text (GPT-1 reads contiguous text only). The "lm" head predicts
    each next token, which a bidirectional model already sees in its input,
    so it needs `causal`.
    """
    if self.causal and "sop" in heads:
      raise ValueError(
          "A causal model (model.causal=True) cannot have the 'sop' head: SOP "
          "and NSP instances put segments out of order half of the time, "
          "which a left-to-right model would learn as real text. Use "
          "config.data.objective='none' (heads: 'lm').")
    if not self.causal and "lm" in heads:
      raise ValueError(
          "The 'lm' head predicts the next token, which a bidirectional "
          "model sees in its input; set model.causal=True.")

  @classmethod
  def from_dict(cls, values: Any) -> "ModelConfig":
    """Builds from a mapping (a ConfigDict's `model` or a JSON dict).

    Unknown keys are refused with the closest valid names, because a silently
    ignored hyperparameter is a wrong experiment.
    """
    values = dict(values)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in names]
    if unknown:
      raise ValueError("Unknown model config keys: " + "; ".join(
          f"{k!r}{hints.did_you_mean(k, names, n=3)}" for k in unknown))
    return cls(**values)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @property
  def layer_kwargs(self) -> dict[str, Any]:
    """What every `layers.Dense` and `layers.Embed` of this model is built
    with: the initializer and its range, and the compute and storage
    dtypes."""
    return dict(init_range=self.initializer_range, initializer=self.initializer,
                dtype=self.compute_dtype,
                param_dtype=self.parameter_dtype)

  @property
  def norm_kwargs(self) -> dict[str, Any]:
    """What every `layers.LayerNorm` of this model is built with."""
    return dict(eps=self.layer_norm_eps, dtype=self.compute_dtype,
                param_dtype=self.parameter_dtype)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def compute_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def parameter_dtype(self):
    return _DTYPES[self.param_dtype]

  @property
  def mlm_activation(self) -> str:
    """The MLM head's activation name."""
    return self.mlm_hidden_act or self.hidden_act

  @property
  def max_length(self) -> int:
    """The longest sequence the position table covers."""
    if self.position_ids_from_padding:
      return self.max_position_embeddings - self.pad_token_id - 1
    return self.max_position_embeddings

  @property
  def num_steps(self) -> int:
    """Blocks applied in one forward pass: each layer runs its whole group."""
    return self.num_hidden_layers * self.inner_group_num

  def is_shared(self, component: str) -> bool:
    """Whether "attention" or "ffn" parameters are shared across depth."""
    return self.share in ("all", component)

  def num_copies(self, component: str) -> int:
    """Distinct parameter sets stored for a component (its stack's length)."""
    if self.is_shared(component):
      return self.num_hidden_groups * self.inner_group_num
    return self.num_steps

  def copy_index(self, component: str) -> list[int]:
    """For each applied block, which stored copy of `component` it uses.

    Shared components follow the official mapping: layer l belongs to group
    int(l / (L / G)) and applies that group's `inner_group_num` blocks.
    """
    if not self.is_shared(component):
      return list(range(self.num_steps))
    layers, groups = self.num_hidden_layers, self.num_hidden_groups
    index = []
    for layer in range(layers):
      group = int(layer / (layers / groups))
      for inner in range(self.inner_group_num):
        index.append(group * self.inner_group_num + inner)
    return index
