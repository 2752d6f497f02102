"""LangChain's standard chat model suites, run offline against the packaged model."""

from __future__ import annotations

from typing import Any

from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_ngram_trie import ChatNGramTrie

# Short answers keep the suites fast (the suites also build models with their own
# max_tokens, so it goes into the standard parameters). The features below are not offered
# by a small, text-only local model and are declared off.
MAX_TOKENS = 16


class _Features:
    @property
    def chat_model_class(self) -> type[ChatNGramTrie]:
        return ChatNGramTrie

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return {**super().standard_chat_model_params, "max_tokens": MAX_TOKENS}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_tool_choice(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_image_urls(self) -> bool:
        return False

    @property
    def supports_pdf_inputs(self) -> bool:
        return False

    @property
    def supports_audio_inputs(self) -> bool:
        return False

    @property
    def supports_video_inputs(self) -> bool:
        return False

    @property
    def supports_image_tool_message(self) -> bool:
        return False

    @property
    def supports_pdf_tool_message(self) -> bool:
        return False

    @property
    def supports_anthropic_inputs(self) -> bool:
        return False

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supported_usage_metadata_details(self) -> dict[str, list[str]]:
        return {"invoke": [], "stream": []}

    @property
    def enable_vcr_tests(self) -> bool:
        return False


class TestChatNGramTrieUnit(_Features, ChatModelUnitTests):
    pass


class TestChatNGramTrieIntegration(_Features, ChatModelIntegrationTests):
    pass
