"""LoRA adapters over the base model (PEFT format), mixed per row in every step: adapter.py reads
and checks one, stack.py holds the slots' weights on the device, slots.py assigns slots (the
scheduler's), registry.py names the loaded adapters, setup.py wires them in at start-up."""
