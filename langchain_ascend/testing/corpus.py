"""Deterministic English training text for the tiny test tokenizers.

The text mixes the bundled prose file (``data/prose_en.txt``) with sentences generated from
templates: weather reports for many cities, numbers and arithmetic, dates and times, JSON
objects, tool calls in the Qwen ``{"name": ..., "arguments": ...}`` shape, small code
snippets and chat turns. Large vocabularies also need many distinct words, so
:func:`training_lines` adds invented words built from syllables until the text can support
the requested number of BPE merges.

Everything is a pure function of ``seed``: :class:`random.Random` with a fixed seed gives the
same sequence on every Python version this project supports.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from importlib import resources

CITIES = (
    "Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Dublin", "Oslo", "Stockholm",
    "Helsinki", "Vienna", "Prague", "Warsaw", "Athens", "Istanbul", "Cairo", "Nairobi", "Lagos",
    "Tokyo", "Osaka", "Seoul", "Beijing", "Shanghai", "Shenzhen", "Hangzhou", "Singapore",
    "Bangkok", "Jakarta", "Mumbai", "Delhi", "Sydney", "Melbourne", "Auckland", "Toronto",
    "Vancouver", "Chicago", "Boston", "Seattle", "Denver", "Austin", "Miami", "New York",
    "San Francisco", "Los Angeles", "Mexico City", "Lima", "Bogota", "Santiago", "Buenos Aires",
    "Sao Paulo", "Reykjavik", "Zurich", "Geneva", "Amsterdam", "Brussels", "Copenhagen",
)
CONDITIONS = (
    "sunny", "cloudy", "partly cloudy", "rainy", "stormy", "foggy", "windy", "snowy",
    "clear", "humid", "hot", "cold", "mild", "overcast", "drizzly",
)
NAMES = (
    "Alice", "Bob", "Carol", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas",
    "Kemal", "Lena", "Mei", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara",
)
UNITS = ("celsius", "fahrenheit")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)
TOPICS = (
    "weather", "travel", "music", "history", "science", "cooking", "sports", "finance",
    "health", "gardening", "programming", "astronomy", "geography", "literature",
)
QUESTIONS = (
    "What is the weather like in {city} today?",
    "Can you check the forecast for {city} on {day}?",
    "How many people live in {city}?",
    "What is {a} plus {b}?",
    "Please multiply {a} by {b}.",
    "Tell me something interesting about {topic}.",
    "Book a table for {n} people in {city} on {day}.",
    "Convert {a} degrees {unit} to the other scale.",
    "Who is the best person to ask about {topic}?",
    "Summarise the news about {topic} in {city}.",
)
ANSWERS = (
    "It is {cond} in {city} with a temperature of {t} degrees {unit}.",
    "The forecast for {city} on {day} is {cond}, with a high of {t} and a low of {t2}.",
    "{a} plus {b} equals {s}.",
    "{a} times {b} is {p}.",
    "I booked a table for {n} people in {city} on {day} at {hh}:{mm}.",
    "{name} knows a lot about {topic} and lives in {city}.",
    "Sorry, I could not find any information about that.",
    "Here is a short summary: the main points are about {topic} and {topic2}.",
)
TOOL_NAMES = (
    "get_weather", "get_forecast", "search_web", "lookup_city", "add", "multiply",
    "get_time", "book_table", "send_email", "read_file", "calculator", "retrieve_documents",
)
CODE_SNIPPETS = (
    "def {fn}({arg}: int) -> int:\n    return {arg} * {a} + {b}\n",
    "for {arg} in range({a}):\n    print({arg}, {arg} ** 2)\n",
    "result = {fn}(city=\"{city}\", unit=\"{unit}\")\n",
    "if {arg} > {a}:\n    raise ValueError(\"{arg} is too large\")\n",
    "import json\ndata = json.loads(text)\nprint(data[\"{arg}\"])\n",
    "class {Name}:\n    def __init__(self, {arg}):\n        self.{arg} = {arg}\n",
)
ARG_NAMES = ("city", "unit", "query", "count", "value", "name", "date", "limit", "x", "y", "text")
SYLLABLES = (
    "ka", "lo", "mi", "ra", "ten", "sho", "vi", "dra", "mun", "pel", "qua", "zor", "bel",
    "tis", "gan", "fu", "ro", "nek", "sal", "di", "wen", "tor", "ly", "cha", "pri", "sto",
    "ven", "ax", "il", "om", "ur", "eth", "bra", "cle", "fin", "gro", "hul", "jas", "kri",
    "mor", "nal", "pon", "rus", "sel", "tam", "vor", "wil", "yen", "zan", "ost", "ard",
)


def _render(template: str, rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(0, 99)
    t = rng.randint(-20, 42)
    return template.format(
        city=rng.choice(CITIES),
        cond=rng.choice(CONDITIONS),
        day=rng.choice(WEEKDAYS),
        unit=rng.choice(UNITS),
        topic=rng.choice(TOPICS),
        topic2=rng.choice(TOPICS),
        name=rng.choice(NAMES),
        Name=rng.choice(NAMES),
        fn=rng.choice(TOOL_NAMES),
        arg=rng.choice(ARG_NAMES),
        a=a,
        b=b,
        s=a + b,
        p=a * b,
        n=rng.randint(1, 12),
        t=t,
        t2=t - rng.randint(1, 12),
        hh=f"{rng.randint(0, 23):02d}",
        mm=f"{rng.choice((0, 15, 30, 45)):02d}",
    )


def _tool_call_text(rng: random.Random) -> str:
    name = rng.choice(TOOL_NAMES)
    arguments: dict[str, object] = {
        rng.choice(ARG_NAMES): rng.choice(CITIES),
        "unit": rng.choice(UNITS),
    }
    if rng.random() < 0.5:
        arguments["days"] = rng.randint(1, 14)
    return json.dumps({"name": name, "arguments": arguments})


def _tool_schema_text(rng: random.Random) -> str:
    name = rng.choice(TOOL_NAMES)
    arg = rng.choice(ARG_NAMES)
    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Return the {rng.choice(TOPICS)} information for a {arg}.",
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string", "description": f"The {arg} to use."}},
                "required": [arg],
            },
        },
    }
    return json.dumps(schema)


def _tool_result_text(rng: random.Random) -> str:
    result = {
        "city": rng.choice(CITIES),
        "temperature": rng.randint(-20, 42),
        "condition": rng.choice(CONDITIONS),
        "humidity": round(rng.random(), 2),
    }
    return json.dumps(result)


def _date_text(rng: random.Random) -> str:
    return (
        f"On {rng.choice(WEEKDAYS)}, {rng.randint(1, 28)} {rng.choice(MONTHS)} "
        f"{rng.randint(1950, 2030)} at {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}, "
        f"{rng.choice(NAMES)} travelled from {rng.choice(CITIES)} to {rng.choice(CITIES)}."
    )


def _number_text(rng: random.Random) -> str:
    a, b = rng.randint(0, 10_000), rng.randint(1, 100)
    return (
        f"{a} + {b} = {a + b}; {a} - {b} = {a - b}; {a} * {b} = {a * b}; "
        f"{a} / {b} = {a / b:.3f}; {rng.random() * 100:.2f}%"
    )


def _invented_word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))


def _invented_sentence(rng: random.Random) -> str:
    words = [_invented_word(rng) for _ in range(rng.randint(6, 14))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice((".", "!", "?", ","))


def _generated_line(rng: random.Random) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return _render(rng.choice(QUESTIONS), rng)
    if kind == 1:
        return _render(rng.choice(ANSWERS), rng)
    if kind == 2:
        return _tool_call_text(rng)
    if kind == 3:
        return _tool_schema_text(rng)
    if kind == 4:
        return _tool_result_text(rng)
    if kind == 5:
        return _date_text(rng)
    if kind == 6:
        return _number_text(rng)
    if kind == 7:
        return _render(rng.choice(CODE_SNIPPETS), rng)
    return f"user: {_render(rng.choice(QUESTIONS), rng)}\nassistant: {_render(rng.choice(ANSWERS), rng)}"


def bundled_prose() -> str:
    """Return the hand-written English prose shipped in ``data/prose_en.txt``."""
    return resources.files("langchain_ascend.testing").joinpath("data/prose_en.txt").read_text(
        encoding="utf-8"
    )


def training_lines(
    *, seed: int = 0, num_generated: int = 4000, num_invented: int = 0
) -> Iterator[str]:
    """Yield the tokenizer training text, one line (or small block) at a time.

    Args:
        seed: Seed of the generator; the same seed always yields the same text.
        num_generated: How many template-generated lines to add after the bundled prose.
        num_invented: How many sentences of invented words to add (needed for vocabularies
            larger than the English text can support).

    Yields:
        Lines of text, without trailing newlines.
    """
    rng = random.Random(seed)
    yield from bundled_prose().splitlines()
    for _ in range(num_generated):
        yield _generated_line(rng)
    for _ in range(num_invented):
        yield _invented_sentence(rng)
