"""The engines a generator can run on, by name (see ``choice``); no torch, so the command
line's parser can offer them."""

ENGINES = ("auto", "eager", "static", "compiled")
