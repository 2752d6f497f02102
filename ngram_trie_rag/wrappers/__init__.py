"""What the framework wrappers (LangChain, LlamaIndex) share, so that each is an adapter
only: the settings mixin and its checks, the model a wrapper names or is given, answer
scopes, tool calls, the one model cache per process, and the sync-to-async bridge."""
