"""``python -m ngram_trie_rag.bench bench|sweep ...``."""

import sys

from .cli import main

sys.exit(main())
