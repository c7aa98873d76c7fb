"""langchain-tests' standard unit suite for AscendChatModel (no model is loaded)."""

from __future__ import annotations

from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_ascend.chat_models import AscendChatModel


class TestAscendChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[AscendChatModel]:
        return AscendChatModel

    @property
    def chat_model_params(self) -> dict:
        # The engine loads on the first call, so a path that is never called is enough here.
        return {"model": "/models/Qwen2.5-7B-Instruct", "device": "cpu", "temperature": 0}

    @property
    def model_override_value(self) -> str:
        return "/models/Qwen2.5-0.5B-Instruct"

    @property
    def init_from_env_params(self) -> tuple[dict, dict, dict]:
        return (
            {"LANGCHAIN_ASCEND_CHAT_MODEL": "/models/from-env"},
            {"device": "cpu"},
            {"model": "/models/from-env", "device": "cpu"},
        )
