"""The GPU check: one prepared run on a lent device (run.sh), its parts and plan (GPU.md)."""
