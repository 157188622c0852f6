"""The fake engine's tokenizer (fake_engine.py): one token a byte (id = byte value), 256 = EOS;
its chat template writes `<role>content` lines and raises on a message holding `BOOM_MARKER`."""

from __future__ import annotations

EOS = 256
BOOM_MARKER = "__boom__"  # a chat message holding this makes the chat template raise RuntimeError


class FakeTokenizer:
    eos_token_ids = (EOS,)
    vocab_size = 257

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", "replace")

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if any(BOOM_MARKER in m["content"] for m in messages):
            raise RuntimeError("template exploded")
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def id_to_token(self, token_id: int) -> str:
        return "<eos>" if token_id == EOS else chr(token_id)

    def token_bytes(self, token_id: int) -> bytes | None:
        return None if token_id >= 256 else bytes([token_id])
