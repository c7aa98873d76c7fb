"""``with AscendTimeline() as tl:`` watches every run started inside the block, as
langchain_core's ``get_usage_metadata_callback()`` does, and nothing after it."""

from __future__ import annotations

import asyncio

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool

from langchain_ascend import AscendTimeline


def fake_llm() -> FakeListChatModel:
    return FakeListChatModel(responses=["one", "two", "three", "four", "five", "six"])


@tool
def double(x: int) -> int:
    """Double a number."""
    return 2 * x


def test_runs_inside_the_block_are_recorded_and_none_after():
    llm = fake_llm()
    with AscendTimeline() as timeline:
        llm.invoke("hi")
        chain = RunnableLambda(lambda text: double.invoke({"x": len(text)})) | RunnableLambda(
            lambda n: llm.invoke(str(n)))
        chain.invoke("abc", config={"run_name": "chain"})
    assert len(timeline.hops) == 2 and len(timeline.tool_calls) == 1
    llm.invoke("after the block")
    assert len(timeline.hops) == 2


def test_an_explicit_callback_inside_the_block_is_not_counted_twice():
    llm = fake_llm()
    with AscendTimeline() as timeline:
        llm.invoke("hi", config={"callbacks": [timeline]})
    assert len(timeline.hops) == 1


def test_nested_blocks_both_see_the_inner_runs():
    llm = fake_llm()
    with AscendTimeline() as outer:
        llm.invoke("outer only")
        with AscendTimeline() as inner:
            llm.invoke("both")
        llm.invoke("outer again")
    assert (len(outer.hops), len(inner.hops)) == (3, 1)


def test_async_runs_and_an_exception_leave_the_block_detached():
    llm = fake_llm()
    timeline = AscendTimeline()

    async def run() -> None:
        with timeline:
            await llm.ainvoke("async hi")
            await asyncio.gather(llm.ainvoke("a"), llm.ainvoke("b"))

    asyncio.run(run())
    assert len(timeline.hops) == 3
    try:
        with timeline:
            llm.invoke("then fails")
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    llm.invoke("after the failure")
    assert len(timeline.hops) == 4


def test_a_plain_handler_is_unaffected_outside_a_block():
    llm = fake_llm()
    timeline = AscendTimeline()
    llm.invoke("not watched")
    llm.invoke("watched", config={"callbacks": [timeline]})
    assert len(timeline.hops) == 1
