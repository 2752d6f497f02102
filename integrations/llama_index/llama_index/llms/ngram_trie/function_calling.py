"""``FunctionCallingLLM`` hooks: tools offered through a system message and a grammar
(see ``tools``), replies turned into ``ToolSelection``s.

``chat_with_tools`` and its async / streaming variants are the base class's: they call
``_prepare_chat_with_tools`` and then ``chat``, so a tool-calling call resolves its draft
source exactly as any chat does (``documents=``, ``drafting_from``, the running query's
retrieved nodes, else the prompt). Argument values copied from a retrieved passage are
then drafted from the trie.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.llms.llm import ToolSelection
from ngram_trie_rag.wrappers.tool_calls import tool_call_grammar

from .tools import tool_choice, tool_selections, tool_spec, with_tools_prompt

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

# The chat keyword that asks for the reply to be read as tool calls (set here only).
TOOL_REPLY = "tool_reply"


class ToolCalling:
    """Mixed into ``NGramTrieLLM`` (which provides ``chat``)."""

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``chat`` arguments: the tools described in the system message, the reply's
        grammar, and ``tool_choice`` ("auto", "required", "none" or a tool name)."""
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        choice = kwargs.pop("tool_choice", None)
        specs = [tool_spec(t) for t in tools]
        if not specs:  # nothing to call: a plain chat
            return {"messages": messages, **kwargs}
        choice = tool_choice(specs, tool_required, choice)
        grammar = tool_call_grammar(specs, choice, parallel=allow_parallel_tool_calls)
        if grammar is None:  # "none": answer in text, tools not mentioned
            return {"messages": messages, **kwargs}
        return {"messages": with_tools_prompt(messages, specs, choice), "grammar": grammar,
                TOOL_REPLY: True, **kwargs}

    def get_tool_calls_from_response(self, response: ChatResponse,
                                     error_on_no_tool_call: bool = True,
                                     **kwargs: Any) -> list[ToolSelection]:
        """The calls in a ``chat_with_tools`` response (or any message carrying calls in
        ``additional_kwargs["tool_calls"]`` or ``ToolCallBlock``s)."""
        calls = tool_selections(response.message)
        if not calls and error_on_no_tool_call:
            raise ValueError(f"expected at least one tool call, got none: "
                             f"{response.message.content!r}")
        return calls
