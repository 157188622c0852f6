"""POST /tokenize and /detokenize: the served model's tokenizer over HTTP (vLLM's routes, with
llama.cpp server's field names accepted beside them)."""
