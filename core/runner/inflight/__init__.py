"""A launched step on the device until it lands: its sampled output's one copy to the host
(sample_output.py) and the device's timeline across steps (device_timeline.py, CUDA)."""
