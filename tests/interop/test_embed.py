"""`Pretrained.embed`: mean-pooled and pooled sentence vectors, independent
of how inputs are batched and padded."""

import jax
import numpy as np
import pytest

from albert_jax import config_lib
from albert_jax.interop.pretrained import Pretrained
from albert_jax.model import albert as albert_lib
from albert_jax.model.config import ModelConfig


@pytest.fixture(name="model", scope="module")
def fixture_model(tiny_tokenizer, fast_compile):
  cfg = ModelConfig.from_dict(config_lib.tiny_model(
      vocab_size=300, max_position_embeddings=64))
  # Initialised in one compiled program: op by op, a tiny ALBERT's init
  # costs ~17 CPU seconds, jitted ~3.
  params = jax.jit(lambda key: albert_lib.Albert(cfg).init(
      key, np.ones((1, 8), np.int32))["params"],
                   compiler_options=fast_compile)(jax.random.key(0))
  return Pretrained(config=None, model_config=cfg, params=params,
                    tokenizer=tiny_tokenizer)


def test_embed_mean_and_pooled(model):
  texts = ["the war is over", "congress met today and nothing new happened"]
  mean = model.embed(texts)
  assert mean.shape == (2, 64) and mean.dtype == np.float32
  enc = model.tokenizer.encode_pair(texts[1])
  ids = np.asarray([enc["input_ids"]])
  out = model(ids, np.asarray([enc["token_type_ids"]]))
  np.testing.assert_allclose(mean[1], np.asarray(out["sequence_output"])[0]
                             .mean(0), rtol=0, atol=1e-5)
  np.testing.assert_allclose(model.embed(texts[0]), mean[0], rtol=0,
                             atol=1e-5)
  pooled = model.embed(texts, pooling="pooled", batch_size=1)
  np.testing.assert_allclose(pooled[1], np.asarray(out["pooled_output"])[0],
                             rtol=0, atol=1e-5)
  assert model.embed([("a question", "an answer")]).shape == (1, 64)
  with pytest.raises(ValueError, match=r"^pooling='max'; choose 'mean' or "
                     "'pooled'\\.$"):
    model.embed(texts, pooling="max")
