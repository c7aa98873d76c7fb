"""The routing key of an OpenAI request and the replica ranking (pure; no Ray needed)."""

from __future__ import annotations

import collections
import doctest

import pytest

from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.serve.ray import routing
from langchain_ascend.serve.ray.routing import rank_replicas, rendezvous_order, routing_key

SYSTEM = {"role": "system", "content": "You are a careful agent. Tools: search, math."}


def _hops(task: str, num_hops: int) -> list[dict]:
    """The bodies of one agent's hops: each hop repeats the conversation and adds a turn."""
    messages = [SYSTEM, {"role": "user", "content": task}]
    bodies = []
    for hop in range(num_hops):
        bodies.append({"model": "tiny", "messages": list(messages), "max_tokens": 8})
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{hop}", "type": "function",
                 "function": {"name": "search", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{hop}", "content": f"result {hop}"},
        ]
    return bodies


def test_doctests_hold():
    assert doctest.testmod(routing).failed == 0


def test_every_hop_of_an_agent_has_the_key_of_its_first():
    keys = {routing_key(body) for body in _hops("find the capital of France", 5)}
    assert len(keys) == 1
    assert next(iter(keys)).startswith("prefix:")


def test_agents_with_another_task_system_prompt_or_model_get_another_key():
    base = routing_key(_hops("task A", 1)[0])
    other_task = routing_key(_hops("task B", 1)[0])
    other_system = dict(_hops("task A", 1)[0])
    other_system["messages"] = [{"role": "system", "content": "other"}] + other_system[
        "messages"][1:]
    other_model = dict(_hops("task A", 1)[0], model="big")
    keys = {base, other_task, routing_key(other_system), routing_key(other_model)}
    assert len(keys) == 4


def test_sampling_parameters_and_tools_do_not_move_the_key():
    body = _hops("task A", 1)[0]
    changed = dict(body, temperature=0.7, max_tokens=99, stream=True, tools=[{"x": 1}])
    assert routing_key(body) == routing_key(changed)


def test_content_parts_and_developer_messages_count_as_prefix():
    parts = {"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    plain = {"model": "m", "messages": [
        {"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    assert routing_key(parts) is not None
    assert routing_key(parts) != routing_key(plain)
    assert routing_key(parts) == routing_key(
        {"model": "m", "messages": list(parts["messages"])})


def test_session_header_wins_in_any_case_and_blank_is_ignored():
    body = _hops("task A", 1)[0]
    assert routing_key(body, {"X-Session-Id": " s1 "}) == "session:s1"
    assert routing_key(None, {"x-session-id": "s1"}) == "session:s1"
    assert routing_key(body, {"X-SESSION-ID": "  "}) == routing_key(body)


@pytest.mark.parametrize("body", [
    None, [], "text", {}, {"messages": "hi"}, {"input": ["a", "b"]},
    {"messages": []},
    {"messages": [{"role": "system", "content": "only a system prompt"}]},
    {"messages": [{"role": "assistant", "content": "no user first"}]},
    {"messages": ["not a message"]},
])
def test_requests_without_a_stable_prefix_have_no_key(body):
    assert routing_key(body, {"content-type": "application/json"}) is None


def test_rendezvous_is_stable_and_independent_of_order():
    ids = [f"replica-{i}" for i in range(5)]
    assert rendezvous_order("k1", ids) == rendezvous_order("k1", list(reversed(ids)))
    assert sorted(rendezvous_order("k1", ids)) == sorted(ids)
    assert rendezvous_order("k1", ids + ids[:2]) == rendezvous_order("k1", ids)


def test_rendezvous_spreads_keys_over_replicas():
    ids = ["a", "b", "c", "d"]
    owners = collections.Counter(rendezvous_order(f"agent-{i}", ids)[0] for i in range(4000))
    assert set(owners) == set(ids)
    assert all(800 <= count <= 1200 for count in owners.values()), owners


def test_removing_a_replica_moves_only_its_own_keys():
    ids = ["a", "b", "c", "d"]
    keys = [f"agent-{i}" for i in range(500)]
    before = {key: rendezvous_order(key, ids)[0] for key in keys}
    after = {key: rendezvous_order(key, ["a", "b", "d"])[0] for key in keys}
    moved = {key for key in keys if before[key] != after[key]}
    assert moved == {key for key in keys if before[key] == "c"}
    assert moved


def test_a_new_replica_takes_keys_only_for_itself():
    keys = [f"agent-{i}" for i in range(500)]
    before = {key: rendezvous_order(key, ["a", "b"])[0] for key in keys}
    after = {key: rendezvous_order(key, ["a", "b", "c"])[0] for key in keys}
    assert all(after[key] in (before[key], "c") for key in keys)


def test_rank_prefers_the_keys_replica_then_the_least_loaded_others():
    ids = ["a", "b", "c"]
    preferred, *rest = rendezvous_order("k", ids)
    loads = {rest[0]: 5, rest[1]: 1, preferred: 2}
    assert rank_replicas("k", ids, loads, saturation=3) == [[preferred], [rest[1], rest[0]]]


def test_a_saturated_preferred_replica_goes_last():
    ids = ["a", "b", "c"]
    preferred, *rest = rendezvous_order("k", ids)
    loads = {preferred: 3, rest[0]: 2, rest[1]: 0}
    assert rank_replicas("k", ids, loads, saturation=3) == [[rest[1], rest[0]], [preferred]]


def test_unknown_load_is_not_saturation():
    ids = ["a", "b"]
    preferred = rendezvous_order("k", ids)[0]
    assert rank_replicas("k", ids, {preferred: None}, saturation=1)[0] == [preferred]


def test_a_lone_replica_is_the_only_rank_even_when_saturated():
    assert rank_replicas("k", ["a"], {"a": 99}, saturation=2) == [["a"]]
    assert rank_replicas("k", [], {}, saturation=2) == []


def test_without_a_key_every_replica_is_one_rank_least_loaded_first():
    assert rank_replicas(None, ["c", "a", "b"], {"a": 2, "b": 0}, saturation=1) == [
        ["b", "c", "a"]]


@pytest.mark.parametrize("saturation", [0, -1, True, 2.0, "3"])
def test_saturation_must_be_a_count(saturation):
    with pytest.raises(InvalidRequestError, match="saturation"):
        rank_replicas("k", ["a"], {}, saturation=saturation)
