"""A draft tree as the model reads it: positions and the ancestor-only mask (windows
moved with each node), the fixed tree sizes of a compiled step and their padding, and a
step's host arrays staged for one copy."""
