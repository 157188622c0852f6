"""Runners: what the engine launches each step. base.py is the protocol; model_runner.py turns a
scheduled batch into tensors (input_builder.py, persistent_batch.py; the layout in step_inputs.py),
runs the model (eager, or graphs/ for decode) and samples (sampler.py, logits_processors.py,
sample_output.py); synthetic.py is the null engine (no model)."""
