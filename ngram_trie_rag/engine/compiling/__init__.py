"""Compiling the static engine's step off the answers' path: shapes compiled on a
background thread, the interpreter's switch interval while it runs, and CUDA-graph
trees for every thread that replays a compiled step."""
