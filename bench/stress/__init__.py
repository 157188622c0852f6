"""Long stress runs of what tests/reliability checks briefly (README.md)."""
