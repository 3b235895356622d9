"""The model's entry refuses ids it would misread (model/albert.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax import Albert
from albert_jax import ModelConfig
from albert_jax import config_lib


@pytest.fixture(scope="module")
def model_and_params():
  model = Albert(ModelConfig(**{**config_lib.TINY, "vocab_size": 50}))
  # Compiled: op by op, initialising even a tiny model takes many seconds.
  return model, jax.jit(model.init)(jax.random.key(0), jnp.array([[1, 2, 3]]))


@pytest.mark.parametrize("ids,message", [
    (np.array([[1, 2, 50]]), "input_ids holds ids in [1, 50] but the model's "
     "vocabulary has 50 entries ([0, 49]); use the tokenizer the model was "
     "trained with."),
    (np.array([[-1, 2]]), "input_ids holds ids in [-1, 2] but the model's "
     "vocabulary has 50 entries ([0, 49]); use the tokenizer the model was "
     "trained with."),
    (np.array([1, 2, 3]), "input_ids must be [batch, seq] token ids, got "
     "shape (3,); add a batch axis for one sequence (ids[None])."),
    (np.array([[1.0, 2.0]]), "input_ids must be integer token ids, got dtype "
     "float64; tokenize the text first (Tokenizer.encode)."),
])
def test_bad_ids_are_refused(model_and_params, ids, message):
  model, params = model_and_params
  with pytest.raises(ValueError) as e:
    model.apply(params, ids)
  assert str(e.value) == message


def test_good_ids_run_eagerly_and_under_jit(model_and_params):
  model, params = model_and_params
  ids = jnp.array([[0, 49, 7]])
  eager = model.apply(params, ids)["sequence_output"]
  jitted = jax.jit(model.apply)(params, ids)["sequence_output"]
  np.testing.assert_allclose(eager, jitted, rtol=1e-5, atol=1e-6)


################################################################################
# The loaded model's entry points (interop/pretrained.py): ids go through the
# jitted forward, where check_ids sees only shapes, so `Pretrained` checks
# their values before.
################################################################################


@pytest.fixture(name="pretrained", scope="module")
def fixture_pretrained(model_and_params):
  from albert_jax.interop.pretrained import Pretrained  # pylint: disable=g-import-not-at-top
  model, params = model_and_params
  return Pretrained(config=None, model_config=model.config,
                    params=params["params"], heads=model.heads)


@pytest.mark.parametrize("args,message", [
    (([[1, 2, 50]],), "input_ids holds ids in [1, 50] but the model's "
     "vocabulary has 50 entries ([0, 49]); use the tokenizer the model was "
     "trained with."),
    ((np.array([[1.7, 2.0]]),), "input_ids must be integer token ids, got "
     "dtype float64; tokenize the text first (Tokenizer.encode)."),
    (([1, 2, 3],), "input_ids must be [batch, seq] token ids, got shape "
     "(3,); add a batch axis for one sequence (ids[None])."),
    (([[1, 2, 3], [4]],), "input_ids must be [batch, seq] with rows of one "
     "length; pad the shorter rows (and mark the padding 0 in "
     "attention_mask)."),
    (([[1, 2]], [[0, 2]]), "token_type_ids holds values in [0, 2] but the "
     "model takes [0, 1]: 0 for the first segment and 1 for the second."),
    (([[1, 2]], [[0]]), "token_type_ids has shape (1, 1) but input_ids (1, "
     "2); give one value per token: 0 for the first segment and 1 for the "
     "second."),
    (([[1, 2]], None, [[1, -1]]), "attention_mask holds values in [-1, 1] "
     "but the model takes 0 or more: 1 for a token and 0 for padding."),
    (([[1, 2]], None, [[1.0, 0.5]]), "attention_mask must be integers, got "
     "dtype float64: 1 for a token and 0 for padding."),
])
def test_the_loaded_model_refuses_bad_inputs(pretrained, args, message):
  with pytest.raises(ValueError) as e:
    pretrained(*args)
  assert str(e.value) == message


def test_the_loaded_model_runs_good_inputs_as_apply_does(pretrained,
                                                         model_and_params):
  model, params = model_and_params
  ids = [[0, 49, 7]]
  out = pretrained(ids, [[0, 0, 1]], np.array([[True, True, False]]))
  want = model.apply(params, jnp.array(ids), jnp.array([[0, 0, 1]]),
                     jnp.array([[1, 1, 0]]))
  np.testing.assert_allclose(out["sequence_output"], want["sequence_output"],
                             rtol=1e-5, atol=1e-6)


def test_text_entry_points_refuse_a_tokenizer_larger_than_the_model(
    pretrained, tiny_tokenizer, caplog):
  """fill_mask and embed encode with the model's tokenizer: one of 300
  pieces on a 50-id model would feed ids it cannot embed. Loading such a
  model warns (model(ids) still works); the text entry points refuse."""
  from albert_jax.interop.pretrained import Pretrained  # pylint: disable=g-import-not-at-top
  with caplog.at_level("WARNING", logger="albert_jax.interop.pretrained"):
    mismatched = Pretrained(config=None,
                            model_config=pretrained.model_config,
                            params=pretrained.params, heads=pretrained.heads,
                            tokenizer=tiny_tokenizer)
  message = (f"The tokenizer ({tiny_tokenizer.path}) has 300 pieces but the "
             "model embeds 50 ids ([0, 49]), so its ids from 50 on would be "
             "misread; set .tokenizer to the one the model was trained with.")
  assert [r.getMessage() for r in caplog.records] == [message]
  for call in (lambda: mismatched.fill_mask("a [MASK] b"),
               lambda: mismatched.embed("a b")):
    with pytest.raises(ValueError) as e:
      call()
    assert str(e.value) == message
