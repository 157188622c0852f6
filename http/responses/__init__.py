"""The OpenAI Responses API (/v1/responses): request bodies -> the chat path's GenRequest, output items,
semantic stream events, the store of finished responses. No aiohttp, no stream layer."""
