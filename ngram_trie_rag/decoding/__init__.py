"""What a decoded answer is made of, whichever engine verified it: the per-call options,
token choice (greedy or sampled), stop strings and the repetition stop, grammars and how a
structure is closed early, the stream of text deltas and the result with its stats."""
