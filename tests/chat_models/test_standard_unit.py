"""langchain-tests' standard unit suite for AscendChatModel (no model is loaded)."""

from __future__ import annotations

from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.testing import build_model


class TestAscendChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[AscendChatModel]:
        return AscendChatModel

    @property
    def chat_model_params(self) -> dict:
        # The model source is checked when the chat model is built (the engine loads on the
        # first call), so the path must be a real model folder.
        return {"model": str(build_model("tiny", "qwen2")), "device": "cpu", "temperature": 0}

    @property
    def model_override_value(self) -> str:
        return str(build_model("tiny", "llama"))

    @property
    def init_from_env_params(self) -> tuple[dict, dict, dict]:
        path = str(build_model("tiny", "qwen3"))
        return (
            {"LANGCHAIN_ASCEND_MODEL": path},
            {"device": "cpu"},
            {"model": path, "device": "cpu"},
        )
