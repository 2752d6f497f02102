"""What a model family needs of the engine, in one place: which models can take a tree
(:mod:`.support`), each layer type's attention window (:mod:`.attention_windows`), and
how deep a draft may reach under a RoPE that follows the length (:mod:`.rope_limits`).
The steps to add a family are in docs/how-it-works.md."""
