"""Runners: what the engine launches each step. base.py is the protocol; model_runner.py turns a
scheduled batch into tensors (input_builder.py, persistent_batch.py; the layout in step_inputs.py),
runs the model (eager, or graphs/ for decode) and samples (sampler.py, logits_processors.py);
inflight/ holds a launched step until it lands (its output's copy to the host, the device's
timeline); synthetic.py is the null engine (no model)."""
