"""The CPU forward variants, behind one choice made per model by measurement: the eager
engine's direct Llama step, linear layouts and packed GQA attention (chosen per forward
size by the measured latency curve; :func:`.forward.forward` dispatches), threads per
forward on a busy host, and the compiled step's transposed linear rows. On other devices
none applies and the model's own modules run."""
