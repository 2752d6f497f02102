"""Commands of the ``ngram-trie-rag`` CLI: ``demo``, ``ask`` (``index`` and ``bench``
live with the retrieval and benchmark packages)."""
