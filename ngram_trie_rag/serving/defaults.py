"""The batch scheduler's and the local server's defaults, in a module without torch, so
the CLI's help can say them without loading the engine."""

MAX_BATCH = 16  # requests decoded together
MAX_QUEUE = 64  # requests waiting at most
PREFILL_CHUNK = 256  # prompt tokens a joining request caches per turn while others decode
