"""`langchain-ascend serve --ray`: the options, and what each replica is given."""

from __future__ import annotations

import doctest

import pytest

from langchain_ascend.serve.ray import ray_command
from langchain_ascend.serve.ray.ray_command import actor_options, replica_argv


def test_doctests_hold():
    assert doctest.testmod(ray_command).failed == 0


def test_replicas_get_every_serve_option_but_the_ray_ones():
    argv = ["--model", "m.gguf", "--ray", "--replicas", "3", "--port", "9000",
            "--ray-address=auto", "--replica-npus", "1", "--replica-cpus=8", "--device",
            "npu", "--replica-gpus", "0"]
    assert replica_argv(argv) == ["--model", "m.gguf", "--port", "9000", "--device", "npu"]


def test_the_serve_parser_takes_the_ray_options():
    pytest.importorskip("fastapi")
    from langchain_ascend.serve.serve_command import build_parser

    args = build_parser().parse_args(["--model", "m", "--ray", "--replicas", "2",
                                      "--replica-npus", "1"])
    assert args.ray and args.replicas == 2
    assert actor_options(args) == {"num_cpus": 1.0, "resources": {"NPU": 1.0}}
    plain = build_parser().parse_args(["--model", "m"])
    assert not plain.ray
    assert actor_options(build_parser().parse_args(["--replica-gpus", "1"])) == {
        "num_cpus": 1.0, "num_gpus": 1.0}
