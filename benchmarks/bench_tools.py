"""NPUStreamToolExecutor vs langgraph's ToolNode, side by side in one process.

Scenarios (each measured ``--repeats`` times with the sides interleaved, the median kept; all
sides warmed up first):

* ``io``: 8 calls of a tool sleeping 200 ms. Bar: wall <= 1.15 x the slowest call.
* ``io_async_tools``: the same with ``async def`` tools sleeping 200 ms.
* ``overhead``: one hop of 1,000 no-op calls; wall time / 1,000 = cost per call.
  ``tool.invoke`` run 1,000 times in a loop (no executor at all) is printed as the floor.
* ``hop``: 200 hops of a single no-op call; cost per hop.

Each scenario runs in sync (``invoke``) and async (``ainvoke``) mode, both sides inside the
same one-node langgraph ``StateGraph`` (ToolNode cannot run outside a graph); our executor is
also timed called directly. Prints a table, the ratios and one JSON line.

Run: ``python benchmarks/bench_tools.py`` (add ``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from langchain_ascend import NPUStreamToolExecutor

SLEEP_S = 0.2


@tool
def fetch(key: str) -> str:
    """Pretend to fetch ``key`` over the network."""
    time.sleep(SLEEP_S)
    return f"value of {key}"


@tool
async def afetch(key: str) -> str:
    """Pretend to fetch ``key`` over the network, asynchronously."""
    await asyncio.sleep(SLEEP_S)
    return f"value of {key}"


@tool
def noop(i: int) -> str:
    """Do nothing."""
    return "ok"


class _State(TypedDict):
    messages: Annotated[list, add_messages]


def _graph(node: Any) -> Any:
    graph = StateGraph(_State)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()


def _message(name: str, count: int) -> AIMessage:
    arg = "key" if name in ("fetch", "afetch") else "i"
    calls = [{"name": name, "args": {arg: f"k{i}" if arg == "key" else i}, "id": f"c{i}",
              "type": "tool_call"} for i in range(count)]
    return AIMessage("", tool_calls=calls)


def _check(output: Any, count: int) -> None:
    messages = output["messages"] if isinstance(output, dict) else output
    tool_messages = [m for m in messages if getattr(m, "type", "") == "tool"]
    assert len(tool_messages) == count, f"expected {count} ToolMessages, got {len(tool_messages)}"
    assert all(m.status == "success" for m in tool_messages), "a call failed"


def _sides(tools: list[Any]) -> dict[str, Any]:
    ours = NPUStreamToolExecutor(tools, device="cpu")
    return {"toolnode": _graph(ToolNode(tools)), "ours_graph": _graph(ours), "ours": ours}


def _measure(sides: dict[str, Any], payload: dict[str, Any], count: int, hops: int,
             repeats: int, modes: tuple[str, ...] = ("sync", "async")
             ) -> dict[str, dict[str, float]]:
    """Seconds per hop for every side and mode: the median over ``repeats`` rounds, sides
    interleaved within each round so background load hits them alike."""
    for runnable in sides.values():  # warm-up (threads, imports, caches) and a sanity check
        if "sync" in modes:
            _check(runnable.invoke(payload), count)
        _check(asyncio.run(runnable.ainvoke(payload)), count)

    def run_sync(runnable: Any) -> None:
        for _ in range(hops):
            runnable.invoke(payload)

    def run_async(runnable: Any) -> None:
        async def loop() -> None:
            for _ in range(hops):
                await runnable.ainvoke(payload)

        asyncio.run(loop())

    samples: dict[str, dict[str, list[float]]] = {m: {k: [] for k in sides} for m in modes}
    for _ in range(repeats):
        for mode in modes:
            for label, runnable in sides.items():
                start = time.perf_counter()
                (run_sync if mode == "sync" else run_async)(runnable)
                samples[mode][label].append((time.perf_counter() - start) / hops)
    return {m: {k: statistics.median(v) for k, v in by.items()} for m, by in samples.items()}


def _floor(calls: list[Any], repeats: int) -> float:
    """Seconds per bare ``tool.invoke`` run in a loop: what any executor must at least pay."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for call in calls:
            noop.invoke(call)
        times.append((time.perf_counter() - start) / len(calls))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls/repeats (smoke run)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    many = 200 if args.quick else 1000
    hops = 50 if args.quick else 200

    report: dict[str, Any] = {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                              "load_average_1m_at_start": round(os.getloadavg()[0], 2)}
    io = _measure(_sides([fetch]), {"messages": [_message("fetch", 8)]}, 8, 1, repeats)
    # ToolNode cannot run async-only tools from invoke(): async mode only.
    aio = _measure(_sides([afetch]), {"messages": [_message("afetch", 8)]}, 8, 1, repeats,
                   modes=("async",))
    overhead = _measure(_sides([noop]), {"messages": [_message("noop", many)]}, many, 1, repeats)
    hop = _measure(_sides([noop]), {"messages": [_message("noop", 1)]}, 1, hops, repeats)

    floor = _floor(_message("noop", many).tool_calls, repeats)

    print(f"{'scenario':<34}{'mode':<7}{'ToolNode':>11}{'ours(graph)':>13}{'ours':>10}"
          f"{'ToolNode/ours':>15}")
    rows = [("8 x sleep 200 ms (s wall)", io, 1.0),
            ("8 x async sleep 200 ms (s wall)", aio, 1.0),
            (f"{many} no-op calls (ms per call)", overhead, 1e3 / many),
            ("1-call hop (ms per hop)", hop, 1e3)]
    for title, result, scale in rows:
        for mode, r in result.items():
            print(f"{title:<34}{mode:<7}{r['toolnode'] * scale:>11.4f}"
                  f"{r['ours_graph'] * scale:>13.4f}{r['ours'] * scale:>10.4f}"
                  f"{r['toolnode'] / r['ours_graph']:>15.2f}")
    print(f"floor: bare tool.invoke, sequential: {floor * 1e3:.4f} ms per call")

    for mode in ("sync", "async"):
        report[f"io_{mode}_wall_s"] = {k: round(v, 4) for k, v in io[mode].items()}
        report[f"io_{mode}_over_slowest"] = round(io[mode]["ours_graph"] / SLEEP_S, 3)
        report[f"overhead_{mode}_ms_per_call"] = {
            k: round(v * 1e3 / many, 4) for k, v in overhead[mode].items()}
        report[f"hop_{mode}_ms"] = {k: round(v * 1e3, 4) for k, v in hop[mode].items()}
        report[f"speedup_io_{mode}"] = round(io[mode]["toolnode"] / io[mode]["ours_graph"], 2)
        report[f"speedup_overhead_{mode}"] = round(
            overhead[mode]["toolnode"] / overhead[mode]["ours_graph"], 2)
    report["io_async_tools_async_wall_s"] = {k: round(v, 4) for k, v in aio["async"].items()}
    report["floor_tool_invoke_ms"] = round(floor * 1e3, 4)
    report["overhead_above_floor_ms_per_call"] = {
        mode: {k: round(v * 1e3 / many - floor * 1e3, 4) for k, v in overhead[mode].items()}
        for mode in overhead}
    report["calls_many"] = many
    bars = {
        "io_wall_le_1.15x_slowest": all(io[m]["ours_graph"] <= 1.15 * SLEEP_S
                                        for m in ("sync", "async")),
        "overhead_le_0.5ms": all(overhead[m]["ours_graph"] * 1e3 / many <= 0.5
                                 for m in ("sync", "async")),
        "not_slower_than_toolnode": all(
            r[m]["ours_graph"] <= r[m]["toolnode"] * 1.02
            for r in (io, aio, overhead, hop) for m in r),
    }
    report["bars"] = bars
    print("bars:", ", ".join(f"{k}={'PASS' if v else 'FAIL'}" for k, v in bars.items()))
    print(json.dumps({"bench": "tools", **report}))


if __name__ == "__main__":
    main()
