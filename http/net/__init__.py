"""Network guards: per-connection read deadlines and the connection cap (connection.py,
conn_limits.py, listener.py), errors written below HTTP (wire_errors.py), API keys (auth.py)."""
