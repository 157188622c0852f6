"""The OpenAI protocol layer: request bodies -> engine requests (protocol.py and its field
readers), response and chunk bodies, tool calls, logprobs, and errors in the API's shape. No
aiohttp and no event loop here: plain data in, plain data (or bytes) out."""
