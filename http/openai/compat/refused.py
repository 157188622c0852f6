"""Request fields of other servers' OpenAI-compatible APIs (vLLM's sampling and template extensions,
llama.cpp's native names) that this server does not serve: a 400 naming the field, never a request
that silently runs without what it asked for. (vLLM's `top_k`, `min_p`, `repetition_penalty`,
`min_tokens`, `stop_token_ids`, `ignore_eos`, `include_stop_str_in_output`, `seed` and its
structured outputs, guided.py, are served.) A field at its off value (false, empty) passes.
"""

from __future__ import annotations

from rillet.http.openai.errors import unsupported
from rillet.http.openai.fields import Body

_REFUSED = {
    "allowed_token_ids": "(vLLM) is not supported; 'logit_bias' can favour or ban tokens",
    "bad_words": "(vLLM) is not supported; 'logit_bias' can ban tokens",
    "use_beam_search": "(vLLM) is not supported: beam search is not served",
    "length_penalty": "(vLLM, beam search) is not supported",
    "return_tokens_as_token_ids": "(vLLM) is not supported",
    "prompt_logprobs": "(vLLM) is not supported; 'echo' with 'logprobs' gives a completion's prompt logprobs",
    "truncate_prompt_tokens": "(vLLM) is supported by /v1/embeddings only",
    "continue_final_message": "(vLLM) is not supported",
    "chat_template": "(vLLM) is not supported: the model's own template is used",
    "chat_template_kwargs": "(vLLM) is not supported",
    "mm_processor_kwargs": "(vLLM) is not supported",
    "documents": "(vLLM) is not supported",
    "guided_whitespace_pattern": "(vLLM) is not supported; the config's structured.whitespace sets it",
    "grammar": "(llama.cpp's GBNF) is not supported; 'guided_grammar' takes a Lark grammar",
    "n_predict": "(llama.cpp) is not supported; use 'max_tokens'",
}


def refuse_extensions(body: Body) -> None:
    for name, why in _REFUSED.items():
        if body.get(name) not in (None, False, "", [], {}):
            raise unsupported(name, why)
    if body.get("add_generation_prompt") is False:
        raise unsupported("add_generation_prompt", "false (vLLM) is not supported: it is always added")
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("continuous_usage_stats"):
        name = "stream_options.continuous_usage_stats"
        raise unsupported(name, "(vLLM) is not supported; 'include_usage' gives the total")
