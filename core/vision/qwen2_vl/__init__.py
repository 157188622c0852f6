"""Qwen2-VL and Qwen2.5-VL: the image processor and placeholder expansion (front.py, pixels.py,
positions.py; torch-free) and the vision tower with its 2x2 patch merger (tower.py)."""
