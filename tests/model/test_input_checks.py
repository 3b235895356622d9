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
  return model, model.init(jax.random.key(0), jnp.array([[1, 2, 3]]))


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
