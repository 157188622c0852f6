"""Image input over HTTP: where each API keeps its image parts (api_parts.py), and loading them
before the body is parsed (loader.py): data: URLs and base64 (sources.py), http(s) behind the
SSRF guard (guard.py, fetch.py), files under one folder (local.py), decoded off the event loop.
The parsers then place the decoded images in the messages and `expand_prompt`
(http/openai/chat_messages.py) hands them to `engine.vision.expand`: core/vision/front.py's flow."""
