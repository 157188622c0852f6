"""Gemma 3's image side (Gemma3ForConditionalGeneration): SigLIP tower, pooling and projector, the
fixed-size image processor, the placeholder expansion, and the image blocks its prefill attends
bidirectionally."""
