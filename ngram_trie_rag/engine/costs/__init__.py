"""What a step costs here: the latency curve the draft budget reads (probed, refined
from real steps, or measured by ``calibrate``) and its one cache, in the process and on
disk."""
