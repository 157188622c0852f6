"""Model definitions: the Llama-family decoder (decoder.py), architecture hyper-parameters
(arch.py), rotary embeddings (rope.py) and named random-weight shapes (shapes.py)."""
