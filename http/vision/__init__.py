"""Image input over HTTP: where each API keeps its image parts (api_parts.py), loading them
(data: URLs, http(s) behind the SSRF guard, local files; loader.py) and decoding them off the event
loop, and the parsed messages' image entries up to `engine.vision.expand` (prompt.py). The flow is
core/vision/front.py's."""
