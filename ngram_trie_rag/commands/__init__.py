"""The ``ngram-trie-rag`` command line: one module per subcommand (its parser and its
handler), over the library's functions; :mod:`.cli` puts them together."""
