"""What the scheduler orders and shares by: request priority, the embeddings' share of a step."""
