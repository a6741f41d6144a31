"""bench/sampler.py's step on a small vocabulary: every config runs (logit_bias's ids past a
--vocab of 1000 raised IndexError)."""
import math

import pytest

from bench import sampler


@pytest.mark.parametrize("name", sorted(sampler.CONFIGS))
def test_every_config_steps_on_a_small_vocabulary(name):
    us = sampler.step_us(sampler.CONFIGS[name], batch=2, vocab=1000, steps=1, repeats=1)
    assert math.isfinite(us)
