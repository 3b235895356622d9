"""`training.optimizer` against a NumPy transcription of the official ALBERT optimizer.

The reference below follows google-research/albert `optimization.py`
(`create_optimizer`: polynomial decay, warmup override, global-norm clip 1.0)
and `lamb_optimizer.py` / `AdamWeightDecayOptimizer` (`apply_gradients`)
line by line, in float64, one variable at a time. A stacked
[copies, ...] parameter of this package is split into `copies` variables
first, because the official code builds separate layers (or groups) as
separate variables and takes each one's trust ratio on its own.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from albert_jax import config_lib
from albert_jax import tree
from albert_jax.model.config import ModelConfig
from albert_jax.training import optimizer as optim
from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS as FAST

COPIES, H, E, V, F = 3, 6, 4, 10, 8
EXCLUDE = ["LayerNorm", "layer_norm", "bias"]  # optimization.py, verbatim
STACKED = re.compile(r"^encoder/(attention|ffn)/")


def param_tree(seed=0):
  """A parameter tree named and shaped like the model's.

  `sop/kernel` starts at zero (‖w‖ = 0 → ratio 1) and copy 1 of
  `encoder/ffn/output/kernel` is zero, so the per-copy ratio matters.
  """
  rng = np.random.default_rng(seed)

  def r(*shape, scale=0.3, loc=0.0):
    return (loc + scale * rng.normal(size=shape)).astype(np.float32)

  ffn_out = r(COPIES, F, H)
  ffn_out[1] = 0.0
  return {
      "embeddings": {
          "word_embeddings": {"embedding": r(V, E)},
          "layer_norm": {"scale": r(E, loc=1.0, scale=0.2),
                         "bias": r(E, scale=0.2)},
      },
      "encoder": {
          "embedding_hidden_mapping_in": {"kernel": r(E, H),
                                          "bias": r(H, scale=0.1)},
          "attention": {
              "query": {"kernel": r(COPIES, H, 2, 3),
                        "bias": r(COPIES, 2, 3, scale=0.1)},
              "layer_norm": {"scale": r(COPIES, H, loc=1.0, scale=0.2),
                             "bias": r(COPIES, H, scale=0.1)},
          },
          "ffn": {
              "intermediate": {"kernel": r(COPIES, H, F),
                               "bias": r(COPIES, F, scale=0.1)},
              "output": {"kernel": ffn_out},
          },
      },
      "mlm": {"output_bias": r(V, scale=0.1),
              "layer_norm": {"scale": r(E, loc=1.0, scale=0.2)}},
      "sop": {"kernel": np.zeros((H, 2), np.float32)},
  }


def grad_trees(params, steps, seed=1):
  """Random gradients; even steps have global norm 3 (clipped to 1), odd
  steps 0.5 (untouched). Step 0 gives `sop/kernel` a zero gradient so that
  ‖w‖ = ‖update‖ = 0 there."""
  rng = np.random.default_rng(seed)
  out = []
  for k in range(steps):
    g = jax.tree.map(
        lambda p: rng.normal(size=p.shape).astype(np.float32), params)
    if k == 0:
      g["sop"]["kernel"] = np.zeros_like(g["sop"]["kernel"])
    norm = np.sqrt(sum(np.sum(np.square(x.astype(np.float64)))
                       for x in jax.tree.leaves(g)))
    target = 3.0 if k % 2 == 0 else 0.5
    out.append(jax.tree.map(lambda x: (x * (target / norm)).astype(
        np.float32), g))
  return out


def flat_variables(tree):
  """{official-style variable name: float64 array}; stacks split by copy."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = "/".join(k.key for k in path)
    leaf = np.asarray(leaf, np.float64)
    if STACKED.search(name):
      head, tail = name.split("/", 2)[1:]
      for i in range(leaf.shape[0]):
        out[f"encoder/{head}_{i}/{tail}"] = leaf[i].copy()
    else:
      out[name] = leaf.copy()
  return out


def official_lr(step, init_lr, num_train_steps, num_warmup_steps, power=1.0,
                end=0.0, start_warmup_step=0):
  """`create_optimizer`'s learning rate at `global_step` = step."""
  # tf.train.polynomial_decay(cycle=False)
  s = min(step, num_train_steps)
  lr = (init_lr - end) * (1 - s / num_train_steps) ** power + end
  if num_warmup_steps:
    steps_int = step - start_warmup_step
    warmup_lr = init_lr * (steps_int / num_warmup_steps)
    is_warmup = float(steps_int < num_warmup_steps)
    lr = (1.0 - is_warmup) * lr + is_warmup * warmup_lr
  return lr


class OfficialOptimizer:
  """The official LAMB / AdamW `apply_gradients` with `create_optimizer`'s
  clipping and schedule, in NumPy float64."""

  def __init__(self, variables, *, lamb, init_lr, num_train_steps,
               num_warmup_steps, weight_decay_rate=0.01, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6, clip_norm=1.0,
               bias_correction=False):
    self.params = variables
    self.m = {k: np.zeros_like(v) for k, v in variables.items()}
    self.v = {k: np.zeros_like(v) for k, v in variables.items()}
    self.lamb = lamb
    self.schedule = lambda s: official_lr(s, init_lr, num_train_steps,
                                          num_warmup_steps)
    self.wd, self.b1, self.b2, self.eps = (weight_decay_rate, beta_1, beta_2,
                                           epsilon)
    self.clip_norm = clip_norm
    self.bias_correction = bias_correction
    self.global_step = 0

  def _excluded(self, name):
    return any(re.search(r, name) is not None for r in EXCLUDE)

  def apply(self, grads):
    if self.clip_norm:
      # tf.clip_by_global_norm: t * clip_norm / max(global_norm, clip_norm).
      norm = np.sqrt(sum(np.sum(g * g) for g in grads.values()))
      grads = {k: g * self.clip_norm / max(norm, self.clip_norm)
               for k, g in grads.items()}
    lr = self.schedule(self.global_step)
    t = self.global_step + 1
    for name, grad in grads.items():
      param = self.params[name]
      next_m = self.b1 * self.m[name] + (1.0 - self.b1) * grad
      next_v = self.b2 * self.v[name] + (1.0 - self.b2) * np.square(grad)
      if self.bias_correction:  # Adam's, for the optional variant only
        update = (next_m / (1 - self.b1 ** t)) / (
            np.sqrt(next_v / (1 - self.b2 ** t)) + self.eps)
      else:
        update = next_m / (np.sqrt(next_v) + self.eps)
      if self.wd and not self._excluded(name):
        update = update + self.wd * param
      ratio = 1.0
      if self.lamb and not self._excluded(name):
        w_norm = np.linalg.norm(param)
        g_norm = np.linalg.norm(update)
        ratio = (w_norm / g_norm) if (w_norm > 0 and g_norm > 0) else 1.0
      self.params[name] = param - ratio * lr * update
      self.m[name], self.v[name] = next_m, next_v
    self.global_step += 1


def make_config(name="lamb", **optimizer):
  config = config_lib.base_config(
      config_lib.tiny_model(), optimizer=name, learning_rate=0.05,
      num_train_steps=8, warmup_steps=2)
  config.optimizer.update(optimizer)
  return config


def check(config):
  """`optim.check` of a whole config, as `config_check.check` calls it."""
  optim.check(config.optimizer, job=config.job,
              num_train_steps=config.get("num_train_steps"))


def run_ours(tx, params, grads):
  """Applies `tx` to each gradient tree; returns the params after each.

  One jitted step per optimizer (FAST_COMPILE_OPTIONS), as are this file's
  other updates: a compilation of a whole update costs a fraction of a
  second, where op-by-op dispatch compiled a kernel for every primitive and
  shape it met (most of this file's time).
  """
  @functools.partial(jax.jit, compiler_options=FAST)
  def step(params, state, g):
    updates, state = tx.update(g, state, params)
    return optax.apply_updates(params, updates), state

  state = tx.init(params)
  history = []
  for g in grads:
    params, state = step(params, state, g)
    history.append(params)
  return history, state


def run_official(params, grads, **kwargs):
  opt = OfficialOptimizer(flat_variables(params), **kwargs)
  history = []
  for g in grads:
    opt.apply(flat_variables(g))
    history.append({k: v.copy() for k, v in opt.params.items()})
  return history, opt


def assert_matches(ours, official, atol=1e-6, rtol=1e-6):
  for step, (a, b) in enumerate(zip(ours, official)):
    a = flat_variables(a)
    assert a.keys() == b.keys()
    for name in a:
      np.testing.assert_allclose(a[name], b[name], atol=atol, rtol=rtol,
                                 err_msg=f"step {step}, {name}")


STEPS = 7  # warmup (lr 0 at step 0), the jump to decay at 2, decay to step 6


def test_reference_covers_every_case():
  """The fixtures exercise what the comparison claims to check."""
  params = param_tree()
  grads = grad_trees(params, STEPS)
  norms = [np.sqrt(sum(np.sum(np.square(x.astype(np.float64)))
                      for x in jax.tree.leaves(g))) for g in grads]
  np.testing.assert_allclose(norms, [3.0, 0.5] * 3 + [3.0], rtol=1e-5)
  names = flat_variables(params)
  assert {"encoder/attention_0/query/kernel",
          "encoder/attention_2/layer_norm/scale",
          "encoder/ffn_1/output/kernel"} <= set(names)
  assert not np.any(names["encoder/ffn_1/output/kernel"])
  assert np.any(names["encoder/ffn_0/output/kernel"])


def test_lamb_matches_official():
  params = param_tree()
  grads = grad_trees(params, STEPS)
  config = make_config()
  tx, _ = optim.make(config.optimizer, config.num_train_steps)
  ours, state = run_ours(tx, params, grads)
  official, opt = run_official(params, grads, lamb=True, init_lr=0.05,
                               num_train_steps=8, num_warmup_steps=2)
  assert_matches(ours, official)
  # Step 0 has lr 0: nothing moves yet (the moments do, as checked below).
  jax.tree.map(np.testing.assert_array_equal, ours[0], params)
  # The moments are the official m and v (no bias correction).
  mu = flat_variables(optax.tree_utils.tree_get(state, "mu"))
  nu = flat_variables(optax.tree_utils.tree_get(state, "nu"))
  for name in mu:
    np.testing.assert_allclose(mu[name], opt.m[name], rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(nu[name], opt.v[name], rtol=1e-5, atol=1e-12)


def test_lamb_trust_ratio_is_per_copy():
  """One ratio over a whole stack is a different (wrong) optimizer."""
  params = param_tree()
  grads = grad_trees(params, 3)
  schedule = optim.albert_schedule(0.05, 8, 0)
  whole = optax.chain(optax.clip_by_global_norm(1.0),
                      optim.lamb(schedule, stacked=r"(?!)"))
  ours, _ = run_ours(whole, params, grads)
  official, _ = run_official(params, grads, lamb=True, init_lr=0.05,
                             num_train_steps=8, num_warmup_steps=0)
  kernel = lambda t: t["encoder"]["ffn"]["output"]["kernel"]  # noqa: E731
  per_copy = np.stack([official[-1][f"encoder/ffn_{i}/output/kernel"]
                       for i in range(COPIES)])
  assert np.max(np.abs(kernel(ours[-1]) - per_copy)) > 1e-3


def test_adamw_matches_official():
  params = param_tree()
  grads = grad_trees(params, STEPS)
  config = make_config("adamw")
  tx, _ = optim.make(config.optimizer, config.num_train_steps)
  ours, _ = run_ours(tx, params, grads)
  official, _ = run_official(params, grads, lamb=False, init_lr=0.05,
                             num_train_steps=8, num_warmup_steps=2)
  assert_matches(ours, official)


@pytest.mark.parametrize("name", ["lamb", "adamw"])
def test_clip_norm_zero_disables_clipping(name):
  params = param_tree()
  grads = grad_trees(params, 4)
  config = make_config(name, clip_norm=0.0)
  tx, _ = optim.make(config.optimizer, config.num_train_steps)
  ours, _ = run_ours(tx, params, grads)
  official, _ = run_official(params, grads, lamb=name == "lamb",
                             init_lr=0.05, num_train_steps=8,
                             num_warmup_steps=2, clip_norm=0.0)
  assert_matches(ours, official)
  clipped, _ = run_official(params, grads, lamb=name == "lamb", init_lr=0.05,
                            num_train_steps=8, num_warmup_steps=2)
  # With Adam's normalisation the clip only shows through the moments'
  # mix of steps, but it does show.
  differs = [np.max(np.abs(clipped[-1][k] - official[-1][k]))
             for k in clipped[-1]]
  assert max(differs) > 1e-4


def test_bias_correction_is_adams():
  params = param_tree()
  grads = grad_trees(params, 4)
  config = make_config(bias_correction=True)
  tx, _ = optim.make(config.optimizer, config.num_train_steps)
  ours, _ = run_ours(tx, params, grads)
  official, _ = run_official(params, grads, lamb=True, init_lr=0.05,
                             num_train_steps=8, num_warmup_steps=2,
                             bias_correction=True)
  assert_matches(ours, official)
  # The transform alone is optax's Adam scaling.
  ours_adam = optim.scale_by_adam(bias_correction=True)
  theirs = optax.scale_by_adam(eps=1e-6)

  @functools.partial(jax.jit, compiler_options=FAST)
  def both(s1, s2, g):
    u1, s1 = ours_adam.update(g, s1)
    u2, s2 = theirs.update(g, s2)
    return u1, u2, s1, s2

  s1, s2 = ours_adam.init(params), theirs.init(params)
  for g in grads[:3]:
    u1, u2, s1, s2 = both(s1, s2, g)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6,
                                                         atol=1e-7), u1, u2)


def test_lamb_with_bias_correction_and_no_exclusions_is_optax_lamb():
  """What remains of optax.lamb once our two departures are switched off."""
  params = param_tree()
  grads = grad_trees(params, 4)
  lr = 0.01
  ours = optim.lamb(lr, exclude=r"(?!)", stacked=r"(?!)",
                    bias_correction=True)
  theirs = optax.lamb(lr, weight_decay=0.01)
  a, _ = run_ours(ours, params, grads)
  b, _ = run_ours(theirs, params, grads)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6,
                                                       atol=1e-7), a[-1], b[-1])


def test_optax_lamb_is_not_the_official_optimizer():
  """optax.lamb (trust ratio on LayerNorm/bias, bias correction) moves the
  parameters elsewhere, so the comparison above is not vacuous."""
  params = param_tree()
  grads = grad_trees(params, 4)
  schedule = optim.albert_schedule(0.05, 8, 0)
  decay = lambda p: optim.path_mask(p, optim.EXCLUDE_PATTERN,  # noqa: E731
                                    match=False)
  theirs = optax.chain(optax.clip_by_global_norm(1.0),
                       optax.lamb(schedule, weight_decay=0.01, mask=decay))
  ours = optax.chain(optax.clip_by_global_norm(1.0), optim.lamb(schedule))
  a, _ = run_ours(ours, params, grads)
  b, _ = run_ours(theirs, params, grads)
  diff = jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), a[-1], b[-1])
  assert diff["embeddings"]["layer_norm"]["scale"] > 1e-3
  assert diff["mlm"]["output_bias"] > 1e-3
  assert diff["encoder"]["attention"]["query"]["kernel"] > 1e-3
  # And only ours agrees with the official code.
  official, _ = run_official(params, grads, lamb=True, init_lr=0.05,
                             num_train_steps=8, num_warmup_steps=0)
  assert_matches(a, official)


def test_excluded_parameters_get_plain_adam_steps():
  """LayerNorm and biases get no decay and no trust ratio: a first step of
  all-ones gradients moves them by exactly lr·m/(√v+ε), m = 0.1, v = 0.001,
  while a decayed stacked kernel moves by lr·‖w‖ per copy."""
  params = param_tree()
  tx = optim.lamb(0.1, weight_decay=0.5)
  ones = jax.tree.map(np.ones_like, params)
  updates, _ = jax.jit(tx.update, compiler_options=FAST)(
      ones, tx.init(params), params)
  m, v = 0.1, 0.001
  expected = -0.1 * m / (np.sqrt(v) + 1e-6)
  for leaf in (updates["embeddings"]["layer_norm"]["scale"],
               updates["encoder"]["attention"]["query"]["bias"],
               updates["mlm"]["output_bias"]):
    np.testing.assert_allclose(leaf, expected, rtol=1e-6)
  kernel = params["encoder"]["attention"]["query"]["kernel"]
  step = updates["encoder"]["attention"]["query"]["kernel"]
  for i in range(COPIES):
    np.testing.assert_allclose(np.linalg.norm(step[i]),
                               0.1 * np.linalg.norm(kernel[i]), rtol=1e-5)


def test_path_names_and_masks():
  params = param_tree()
  names = tree.paths(params)
  assert names["encoder"]["attention"]["query"]["kernel"] == (
      "encoder/attention/query/kernel")
  decay = optim.path_mask(params, optim.EXCLUDE_PATTERN, match=False)
  assert decay["encoder"]["ffn"]["intermediate"]["kernel"]
  assert decay["embeddings"]["word_embeddings"]["embedding"]
  assert not decay["embeddings"]["layer_norm"]["scale"]
  assert not decay["encoder"]["ffn"]["intermediate"]["bias"]
  assert not decay["mlm"]["output_bias"]
  stacked = optim.path_mask(params, optim.STACKED_PATTERN)
  assert stacked["encoder"]["ffn"]["output"]["kernel"]
  assert not stacked["encoder"]["embedding_hidden_mapping_in"]["kernel"]


PEAK, TOTAL, WARMUP = 0.00176, 100, 10


@pytest.mark.parametrize("step,expected", [
    (0, 0.0),
    (1, PEAK / WARMUP),
    (WARMUP - 1, PEAK * (WARMUP - 1) / WARMUP),
    # Warmup ends on the decay line from step 0, not at the peak.
    (WARMUP, PEAK * (1 - WARMUP / TOTAL)),
    (55, PEAK * 0.45),
    (TOTAL - 1, PEAK / TOTAL),
    (TOTAL, 0.0),
    (TOTAL + 50, 0.0),
])
def test_schedule_values(step, expected):
  schedule = optim.albert_schedule(PEAK, TOTAL, WARMUP)
  assert float(schedule(step)) == pytest.approx(expected, rel=1e-6, abs=1e-12)
  assert float(schedule(step)) == pytest.approx(
      official_lr(step, PEAK, TOTAL, WARMUP), rel=1e-6, abs=1e-12)
  # The schedule make() returns is the same one.
  config = make_config(learning_rate=PEAK, warmup_steps=WARMUP)
  config.num_train_steps = TOTAL
  _, made = optim.make(config.optimizer, config.num_train_steps)
  assert float(made(step)) == float(schedule(step))


def test_schedule_is_not_join_schedules():
  """optax.join_schedules restarts the decay at the boundary."""
  ours = optim.albert_schedule(PEAK, TOTAL, WARMUP)
  joined = optax.join_schedules(
      [optax.linear_schedule(0.0, PEAK, WARMUP),
       optax.polynomial_schedule(PEAK, 0.0, 1, TOTAL - WARMUP)], [WARMUP])
  for step in range(WARMUP):
    assert float(ours(step)) == pytest.approx(float(joined(step)), rel=1e-6,
                                              abs=1e-12)
  for step in (WARMUP, 40, TOTAL - 1):
    assert float(ours(step)) < float(joined(step)) - 1e-6
  assert float(joined(WARMUP)) == pytest.approx(PEAK)


def test_schedule_options():
  # power, end, and start_warmup_step as create_optimizer codes them.
  s = optim.albert_schedule(1.0, 10, 0, end=0.1, power=2.0)
  for step in (0, 3, 10, 12):
    frac = min(step, 10) / 10
    assert float(s(step)) == pytest.approx(0.9 * (1 - frac) ** 2 + 0.1)
  s = optim.albert_schedule(1.0, 100, 10, start_warmup_step=5)
  assert float(s(5)) == 0.0
  assert float(s(14)) == pytest.approx(0.9)
  assert float(s(15)) == pytest.approx(official_lr(15, 1.0, 100, 10, 1.0,
                                                   0.0, 5))
  assert float(s(15)) == pytest.approx(0.85)
  # Jittable with a traced step.
  assert float(jax.jit(s)(jnp.int32(14))) == pytest.approx(0.9)


def test_unknown_optimizer_is_refused():
  config = make_config("sgd")
  with pytest.raises(ValueError, match=r"optimizer.name='sgd'.*adamw.*lamb"):
    optim.make(config.optimizer, config.num_train_steps)


def test_weight_decay_zero_keeps_exclusions_out_of_trust_ratio():
  """Official: wd 0 skips decay everywhere, yet layer adaptation still
  excludes LayerNorm/bias."""
  params = param_tree()
  grads = grad_trees(params, 3)
  config = make_config(weight_decay=0.0)
  tx, _ = optim.make(config.optimizer, config.num_train_steps)
  ours, _ = run_ours(tx, params, grads)
  official, _ = run_official(params, grads, lamb=True, init_lr=0.05,
                             num_train_steps=8, num_warmup_steps=2,
                             weight_decay_rate=0.0)
  assert_matches(ours, official)


@pytest.mark.parametrize("key,value,allowed", [
    ("learning_rate", 0.0, "a finite number > 0"),
    ("learning_rate", float("nan"), "a finite number > 0"),
    ("learning_rate", float("inf"), "a finite number > 0"),
    ("b1", 1.0, "in [0, 1)"), ("b1", -0.1, "in [0, 1)"),
    ("b2", 1.5, "in [0, 1)"), ("eps", 0.0, "a finite number > 0"),
    ("weight_decay", -0.01, "a finite number >= 0"),
    ("clip_norm", -1.0, "a finite number >= 0 (0: no clipping)"),
    ("warmup_steps", -5, "a whole number >= 0"),
    ("learning_rate", "fast", "a finite number > 0")])
def test_check_refuses_values_that_cannot_train(key, value, allowed):
  c = config_lib.base_config(config_lib.tiny_model())
  with c.unlocked(), c.optimizer.ignore_type():
    c.optimizer[key] = value
  with pytest.raises(ValueError) as error:
    check(c)
  assert str(error.value) == (
      f"config.optimizer.{key}={value!r} must be {allowed}, e.g. "
      f"--config.optimizer.{key}={dict(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, clip_norm=1.0, warmup_steps=0)[key]}.")


def test_check_accepts_every_shipped_config():
  import importlib.util  # pylint: disable=g-import-not-at-top
  from locations import CONFIGS  # pylint: disable=g-import-not-at-top
  for path in sorted(CONFIGS.glob("*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(None)
    check(config)
    if config.get("finetune") is not None:
      check(config.finetune)


################################################################################
# Layer-wise learning-rate decay (ELECTRA's `_get_layer_lrs`).
################################################################################


def _fine_tuning_tree(layers, copies=None, scope="albert/"):
  """Zeros named and shaped like a fine-tuned model's parameters: an
  unshared stack of `copies` (default `layers`) blocks, a pooler, a head."""
  copies = layers if copies is None else copies
  return {k: jnp.zeros(s, jnp.float32) for k, s in {
      f"{scope}embeddings/word_embeddings/embedding": (V, E),
      f"{scope}embeddings/layer_norm/scale": (E,),
      f"{scope}encoder/embedding_hidden_mapping_in/kernel": (E, H),
      f"{scope}encoder/attention/query/kernel": (copies, H, 2, 3),
      f"{scope}encoder/attention/layer_norm/bias": (copies, H),
      f"{scope}encoder/ffn/output/kernel": (copies, F, H),
      f"{scope}pooler/kernel": (H, H),
      "head/classifier/kernel": (H, 2),
      "head/classifier/bias": (2,)}.items()}


def _unflat(flat):
  out = {}
  for path, leaf in flat.items():
    *parents, name = path.split("/")
    node = out
    for p in parents:
      node = node.setdefault(p, {})
    node[name] = leaf
  return out


def test_layer_rates_are_electras_by_hand():
  """L = 3, decay 0.5: ELECTRA's lr × 0.5^(L + 2 − depth) with depth 0 for
  the embeddings, i + 1 for layer i and L + 2 for the head; the pooler sits
  at depth L + 1."""
  model = config_lib.model_config(**{**config_lib.TINY, "num_hidden_layers": 3,
                                     "share": "none"})
  cfg = ModelConfig.from_dict(model.to_dict())
  factors = tree.flatten(optim.layer_lr_multipliers(
      _unflat(_fine_tuning_tree(3)), cfg, 0.5))
  for key in ("embeddings/word_embeddings/embedding",
              "embeddings/layer_norm/scale",
              "encoder/embedding_hidden_mapping_in/kernel"):
    assert float(factors[f"albert/{key}"]) == 0.03125  # 0.5^5
  for key, shape in (("attention/query/kernel", (3, 1, 1, 1)),
                     ("attention/layer_norm/bias", (3, 1)),
                     ("ffn/output/kernel", (3, 1, 1))):
    f = np.asarray(factors[f"albert/encoder/{key}"])
    assert f.shape == shape
    # Bottom layer 0.5^4, then 0.5^3, top layer 0.5^2.
    assert f.ravel().tolist() == [0.0625, 0.125, 0.25]
  assert float(factors["albert/pooler/kernel"]) == 0.5
  assert float(factors["head/classifier/kernel"]) == 1.0
  assert float(factors["head/classifier/bias"]) == 1.0
  # Pre-training names (no "albert/" scope) get the same rates; decay 1 is
  # every factor 1.
  bare = tree.flatten(optim.layer_lr_multipliers(
      _unflat(_fine_tuning_tree(3, scope="")), cfg, 0.5))
  assert float(bare["embeddings/layer_norm/scale"]) == 0.03125
  assert np.asarray(bare["encoder/ffn/output/kernel"]).ravel().tolist() == [
      0.0625, 0.125, 0.25]
  ones = tree.flatten(optim.layer_lr_multipliers(
      _unflat(_fine_tuning_tree(3)), cfg, 1.0))
  assert all(np.all(np.asarray(v) == 1.0) for v in ones.values())


def test_layer_rates_follow_copies_to_their_layer():
  """inner_group_num 2: each layer applies two blocks, two copies of the
  stack, both at the layer's depth."""
  cfg = ModelConfig.from_dict(config_lib.model_config(
      **{**config_lib.TINY, "num_hidden_layers": 2, "share": "none",
         "inner_group_num": 2}).to_dict())
  factors = tree.flatten(optim.layer_lr_multipliers(
      _unflat(_fine_tuning_tree(2, copies=4)), cfg, 0.5))
  # L = 2: layer 0 at 0.5^3, layer 1 at 0.5^2.
  assert np.asarray(factors["albert/encoder/ffn/output/kernel"]).ravel(
  ).tolist() == [0.125, 0.125, 0.25, 0.25]


def test_layer_decay_scales_each_adamw_step_exactly():
  """Two steps of AdamW with decay 0.5 move every parameter by its factor
  times the undecayed step (Adam's moments see the same gradients; the
  weight decay is scaled with the rest, as ELECTRA's lr × (update + wd·w))."""
  cfg = ModelConfig.from_dict(config_lib.model_config(
      **{**config_lib.TINY, "num_hidden_layers": 3, "share": "none"}
  ).to_dict())
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda z: jnp.asarray(rng.normal(size=z.shape), jnp.float32),
      _unflat(_fine_tuning_tree(3)))
  grads = [jax.tree.map(
      lambda z: jnp.asarray(rng.normal(size=z.shape), jnp.float32), params)
           for _ in range(2)]
  config = make_config("adamw")
  with config.unlocked():
    config.job = "finetune"
  steps = config.num_train_steps
  plain, _ = run_ours(optim.make(config.optimizer, steps)[0], params, grads)
  config.optimizer.layerwise_lr_decay = 0.5
  check(config)
  decayed, _ = run_ours(optim.make(config.optimizer, steps, cfg)[0], params,
                        grads)
  factors = optim.layer_lr_multipliers(params, cfg, 0.5)
  # The first step's rate is 0 (warmup from 0), so both runs reach the
  # second step from the same parameters. Clipping is by the global norm of
  # the gradients, before the decay.
  for p0, p1, p2, f in zip(*(jax.tree.leaves(t) for t in (
      params, plain[1], decayed[1], factors))):
    assert np.all(p1 != p0)
    np.testing.assert_allclose(p2 - p0, (p1 - p0) * np.asarray(f),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("share", ["all", "attention", "ffn"])
def test_layer_decay_refuses_shared_stacks(share):
  cfg = ModelConfig.from_dict(config_lib.tiny_model(share=share).to_dict())
  config = make_config("adamw")
  with config.unlocked():
    config.job = "finetune"
  config.optimizer.layerwise_lr_decay = 0.8
  with pytest.raises(ValueError) as error:
    optim.make(config.optimizer, config.num_train_steps, cfg)
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith("optimizer.layerwise_lr_decay=0.8 needs a "
                            "layer's own parameters, but model.share=")
  assert "one set serves every layer" in message
  assert "layerwise_lr_decay=1.0" in message
  # Off, a shared stack trains as before.
  config.optimizer.layerwise_lr_decay = 1.0
  optim.make(config.optimizer, config.num_train_steps, cfg)


def test_layer_decay_check():
  config = make_config("adamw")
  assert config.optimizer.layerwise_lr_decay == 1.0
  config.optimizer.layerwise_lr_decay = 0.9
  with pytest.raises(ValueError, match=r"^config.optimizer.layerwise_lr_decay"
                     r"=0.9 is for fine-tuning; a pre-training run keeps it "
                     r"at 1.0\.$"):
    check(config)
  with config.unlocked():
    config.job = "finetune"
  check(config)
  for bad in (0.0, 1.5, float("nan")):
    config.optimizer.layerwise_lr_decay = bad
    with pytest.raises(ValueError, match=re.escape(
        f"config.optimizer.layerwise_lr_decay={bad!r} must be in (0, 1] "
        "(1: no decay), e.g. --config.optimizer.layerwise_lr_decay=1.0.")):
      check(config)
  config.optimizer.layerwise_lr_decay = 0.9
  with pytest.raises(ValueError, match="applies to fine-tuning only"):
    # No model: nothing to decay by.
    optim.make(config.optimizer, config.num_train_steps)
