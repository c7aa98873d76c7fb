"""build_ray_app's engine deployment options (no Ray cluster needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve", reason="the application needs the 'ray' extra")
from langchain_ascend.errors import InvalidRequestError  # noqa: E402
from langchain_ascend.serve.ray.ray_app import build_ray_app, replica_options  # noqa: E402
from langchain_ascend.serve.ray.router import PrefixAffinityRouter  # noqa: E402


def _options(**kwargs):
    base = {"replicas": 2, "autoscaling_config": None, "ray_actor_options": None,
            "max_ongoing_requests": 32, "saturation": None, "health_check_period_s": 5.0,
            "health_check_timeout_s": 30.0}
    return replica_options(**{**base, **kwargs})


def test_fixed_replicas_with_the_prefix_router_and_resources():
    options = _options(ray_actor_options={"resources": {"NPU": 1}}, saturation=8)
    assert options["num_replicas"] == 2 and "autoscaling_config" not in options
    assert options["ray_actor_options"] == {"resources": {"NPU": 1}}
    router = options["request_router_config"]
    assert router.request_router_class == (
        f"{PrefixAffinityRouter.__module__}.{PrefixAffinityRouter.__qualname__}")
    assert router.request_router_kwargs == {"saturation": 8}
    assert options["max_ongoing_requests"] == 32


def test_autoscaling_instead_of_a_count():
    options = _options(replicas=None, autoscaling_config={"min_replicas": 1,
                                                          "max_replicas": 4})
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4}
    assert "num_replicas" not in options


def test_exactly_one_of_replicas_and_autoscaling():
    with pytest.raises(ValueError, match="exactly one"):
        _options(autoscaling_config={"max_replicas": 2})
    with pytest.raises(ValueError, match="exactly one"):
        _options(replicas=None)


@pytest.mark.parametrize(("name", "value"), [("replicas", 0), ("saturation", 0),
                                             ("max_ongoing_requests", True)])
def test_counts_are_checked(name, value):
    with pytest.raises(InvalidRequestError, match=name):
        _options(**{name: value})


def test_build_needs_a_model_or_a_builder():
    with pytest.raises(ValueError, match="model="):
        build_ray_app(replicas=1)
    assert build_ray_app("/models/m", replicas=1) is not None
