"""The engines a generator can run on, by name (see ``choice``); no torch, so the command
line's parser can offer them."""

ENGINES = ("auto", "eager", "static", "compiled", "uniform", "uniform-compiled")
UNIFORM_NODES = 32  # ``uniform``: every step's tree size (the drafters' default num_draft)
