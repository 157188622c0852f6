"""The Anthropic Messages API (/v1/messages): request bodies -> the chat path's GenRequest, message
bodies, stream events and errors in Anthropic's shape. No aiohttp, no stream layer."""
