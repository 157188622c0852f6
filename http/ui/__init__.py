"""The browser page at /: its routes and headers (routes.py) and the static files (static/)."""
