"""LangChain's standard chat model suites, run offline against the packaged model."""

from __future__ import annotations

from typing import Any

from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_ngram_trie import ChatNGramTrie

# The suites build models with their own max_tokens, so ours goes into the standard
# parameters: enough for a tool call or a short JSON object (a call's JSON scaffolding alone
# is ~25 tokens, free to draft as the grammar forces it), short enough to keep the suites
# fast. Tools, structured output and JSON mode run under a grammar; media inputs are off
# (the model reads text only). A structured answer that loops (the joke tests: SmolLM2-135M
# repeats "the cat was a cat, ..." inside the setup string) is stopped by the default
# repetition stop or the budget and closed so that it parses
# (ngram_trie_rag.decoding.grammar_closing).
MAX_TOKENS = 96


class _Features:
    @property
    def chat_model_class(self) -> type[ChatNGramTrie]:
        return ChatNGramTrie

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        # max_retries: the model is not called over a network here, so nothing retries
        # (an unknown keyword is refused, never silently dropped).
        params = {**super().standard_chat_model_params, "max_tokens": MAX_TOKENS}
        params.pop("max_retries", None)
        return params

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def structured_output_kwargs(self) -> dict[str, Any]:
        return {"method": "json_schema"}  # the default; function_calling: test_lc_tools.py

    @property
    def supports_json_mode(self) -> bool:
        return True

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
