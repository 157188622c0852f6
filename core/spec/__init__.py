"""Speculative decoding: drafters propose tokens, one forward of the model verifies them.

drafter.py (the interface), ngram.py (prompt lookup), draft_model.py (a second, smaller model),
draft_length.py (how many drafted tokens pay, per request: by the matched suffix for the
lookup) and adaptive.py (adaptive k for a draft model), speculator.py (what the engine calls each
step), views.py and grammar.py (sampling each verified position as if the drafts before it were accepted),
rejection.py (standard rejection sampling for drafters that give a distribution),
verify_layout.py (the padded [rows, 1 + k] layout of the graph verify step).
"""
