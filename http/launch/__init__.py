"""Start-up helpers of `rillet serve`: the model path check, process tuning, the load progress
bar and the ready banner."""
