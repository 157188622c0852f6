"""The hostile-body fuzzer's parts: values and field lists (values.py), body strategies per API
(chat_bodies.py, api_bodies.py), the checks every answer must pass (chat_checks.py, api_checks.py)
and the HTTP client that applies them (client.py). Shared by tests/reliability/test_fuzz_bodies.py
and bench/stress/fuzz_bodies.py."""
