"""Argument checks that run before anything is sent."""
import math

import pytest

from flytekitplugins_ddlscale import InvalidInputError
from flytekitplugins_ddlscale._core.validation import MAX_REPLICAS, validate_replicas, validate_tier_name, validate_timeout


@pytest.mark.parametrize("value", [0, 1, MAX_REPLICAS])
def test_good_replicas(value):
    assert validate_replicas(value) == value


@pytest.mark.parametrize("value", [-1, MAX_REPLICAS + 1, True, False, 2.0, "2", None])
def test_bad_replicas(value):
    with pytest.raises(InvalidInputError) as info:
        validate_replicas(value, field="target.replicas")
    assert info.value.field == "target.replicas" and "integer" in info.value.allowed


@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan, True, "10", None])
def test_bad_timeouts(value):
    with pytest.raises(InvalidInputError):
        validate_timeout(value)


def test_timeouts_and_tiers():
    assert validate_timeout(3) == 3.0
    assert validate_tier_name(None) is None
    assert validate_tier_name("  GPU ") == "GPU"
    for bad in ("", "   ", 5):
        with pytest.raises(InvalidInputError):
            validate_tier_name(bad, field="head_hw_tier")
