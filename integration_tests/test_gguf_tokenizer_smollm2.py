"""SmolLM2's tokenizer built from its GGUF metadata (engine.model_source.gguf_tokenizer) is the
one transformers builds from the file: the same tokenizer.json, ids and decoded text on a set
of texts (the demo's prompt rendered through the chat template among them), the same special
tokens and chat template; and it builds in a fraction of transformers' time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from langchain_ascend.testing import needs_smollm2, smollm2_gguf_path

pytestmark = [needs_smollm2(), pytest.mark.slow, pytest.mark.timeout(900)]

TEXTS = [
    "The capital of France is", "def fibonacci(n):\n    return n if n < 2 else n - 1",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "naïve café 😀 中文 Ελληνικά  two  spaces\n\n\ttab", "x = 12345 + 678.9; don't we've",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Beijing"}}\n</tool_call>',
    "<repo_name>a<file_sep>b<jupyter_code>c<empty_output>",
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object, Path, Path]:
    """(ours, transformers', ours saved, theirs saved), with the build times printed."""
    from transformers import AutoTokenizer

    from langchain_ascend.engine.model_source.gguf_tokenizer import gguf_tokenizer

    path = Path(smollm2_gguf_path())
    started = time.process_time()
    ours = gguf_tokenizer(path, "llama")
    ours_s = time.process_time() - started
    started = time.process_time()
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    theirs_s = time.process_time() - started
    print(f"tokenizer CPU time: ours {ours_s:.2f} s, transformers {theirs_s:.2f} s")
    root = tmp_path_factory.mktemp("tokenizers")
    ours.save_pretrained(root / "ours")
    theirs.save_pretrained(root / "theirs")
    return ours, theirs, root / "ours", root / "theirs"


def test_same_tokenizer_json_and_template(pair) -> None:
    _, _, ours_dir, theirs_dir = pair
    assert json.loads((ours_dir / "tokenizer.json").read_text()) == json.loads(
        (theirs_dir / "tokenizer.json").read_text())
    assert (ours_dir / "chat_template.jinja").read_text() == (
        theirs_dir / "chat_template.jinja").read_text()


def test_same_ids_special_tokens_and_rendering(pair) -> None:
    from transformers import AutoTokenizer

    from langchain_ascend.app.demo import SYSTEM_PROMPT

    ours, theirs, ours_dir, _ = pair
    reloaded = AutoTokenizer.from_pretrained(ours_dir)
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": "Get the weather in Beijing."}]
    rendered = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for candidate in (ours, reloaded):
        assert candidate.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True) == rendered
        for text in [*TEXTS, rendered]:
            ids = theirs(text)["input_ids"]
            assert candidate(text)["input_ids"] == ids, text
            assert candidate.decode(ids, skip_special_tokens=True) == theirs.decode(
                ids, skip_special_tokens=True)
        for attribute in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id",
                          "all_special_ids"):
            assert getattr(candidate, attribute) == getattr(theirs, attribute), attribute
