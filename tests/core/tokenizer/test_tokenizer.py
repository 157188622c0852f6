"""The tokenizer against transformers: ids, text, chat templates, and the bytes each token adds.

The reference is `AutoTokenizer.from_pretrained(dir, gguf_file=...)` on the same GGUF file (loaded
once per module, ~5 s). A tiny sentencepiece-style GGUF written here covers the `llama` tokenizer
model (byte fallback, `▁`, merges recovered from scores).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import gguf
import pytest
from harness.hf_gguf import hf_default_tokenizer
from rillet.core.loaders.default_model import default_model_path
from rillet.core.tokenizer.chat_template import ChatTemplateError
from rillet.core.tokenizer.gguf import bytes_to_unicode
from rillet.core.tokenizer.tokenizer import Tokenizer

TEXTS = [
    "",
    "a",
    "Hello world",
    "Hello, world! How are you?",
    " leading space",
    "trailing space ",
    "multiple   spaces   inside",
    " " * 20,
    "\t\t\ttabs",
    "line1\n\n\nline2",
    "a\r\nb",
    "x  \n  y\n",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say we've won, can't they?",
    "UPPERCASE lowercase MiXeD CaSe",
    "numbers 1234567890 3.14159 -42 1e10 0x1F",
    "mail me: someone@example.com or https://example.org/a/b?q=1&r=2#frag",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { a[i] += 1; }",
    '<div class="x">&amp; &lt;tag&gt;</div>',
    "SELECT * FROM t WHERE id = 1;",
    '{"key": [1, 2, {"nested": null, "t": true}]}',
    "café naïve résumé déjà vu",
    "Ελληνικά γράμματα",
    "Русский текст",
    "日本語のテキストです。",
    "中文字符测试，标点符号！",
    "한국어 텍스트",
    "العربية من اليمين",
    "हिन्दी पाठ",
    "emoji 😀🎉👍🏽",
    "family 👨‍👩‍👧‍👦 zwj",
    "flags 🇫🇷🇯🇵",
    "math ∑∫√∞ ≠ ≤ ≥ ±",
    "zero\u200bwidth space",
    "combining e\u0301 accent",
    "\u00a0non-breaking\u00a0space",
    "mixed 日本 and English 😀 ok",
    "<|im_start|>user\nhi there<|im_end|>\n",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "<repo_name>rillet<file_sep>main.py",
    "< |im_start| > is not special",
    "<|im_start|><|im_start|>",
    "Ġ Ċ literal byte-alphabet characters",
    "\x00 control \x07 characters \x1b[0m",
    "\ufffd replacement char",
    "lorem ipsum dolor sit amet " * 40,
]

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why? 😀\n  (multi-line)"},
    ],
    [{"role": "system", "content": ""}, {"role": "user", "content": "日本語"}],
]


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer.from_gguf(default_model_path())


@pytest.fixture(scope="module")
def theirs() -> Any:
    return hf_default_tokenizer()


def _joined(tok: Tokenizer, ids: list[int]) -> str:
    return b"".join(tok.token_bytes(i) or b"" for i in ids).decode("utf-8", errors="replace")


# ---- the default model's tokenizer vs transformers --------------------------------------------


def test_encode_matches_transformers(ours: Tokenizer, theirs: Any) -> None:
    for text in TEXTS:
        for special in (True, False):
            want = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == want, text


def test_decode_matches_transformers(ours: Tokenizer, theirs: Any) -> None:
    for text in TEXTS:
        ids = ours.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours.decode(ours.encode("<|im_start|>user\nhi<|im_end|>")) == "user\nhi"


def test_token_bytes_concatenate_to_decode(ours: Tokenizer) -> None:
    for text in TEXTS:
        ids = ours.encode(text)
        assert _joined(ours, ids) == ours.decode(ids), text


def test_token_bytes_of_every_token(ours: Tokenizer) -> None:
    table = ours.token_bytes_table()
    assert len(table) == ours.vocab_size == 49152
    assert ours.token_bytes_table() is table  # built once
    for i in range(ours.vocab_size):
        raw = ours.token_bytes(i)
        if i in ours.special_token_ids:
            assert raw is None and table[i] == b"" and ours.decode([i]) == ""
            assert ours.decode([i], skip_special_tokens=False) == ours.id_to_token(i)
        else:
            assert raw is not None and raw == table[i]
            assert raw.decode("utf-8", errors="replace") == ours.decode([i]), i
    assert ours.token_bytes(-1) is None and ours.token_bytes(ours.vocab_size) is None
    assert ours.id_to_token(ours.vocab_size + 5) == ""


def test_vocabulary_facts(ours: Tokenizer, theirs: Any) -> None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode as hf_bytes_to_unicode

    assert bytes_to_unicode() == hf_bytes_to_unicode()
    assert ours.eos_token_ids == (2,) and ours.bos_token_id == 1
    assert ours.id_to_token(2) == "<|im_end|>" == theirs.eos_token
    assert ours.special_token_ids == frozenset(theirs.all_special_ids) | frozenset(range(17))
    assert ours.id_to_token(19556) == theirs.convert_ids_to_tokens(19556)
    assert ours.token_bytes(905) == b" world"


def test_chat_template_matches_transformers(ours: Tokenizer, theirs: Any) -> None:
    for messages in CONVERSATIONS:
        for gen in (True, False):
            want = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(messages, add_generation_prompt=gen) == want
    text = ours.apply_chat_template(CONVERSATIONS[0])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")


def test_hf_folder_matches_gguf(ours: Tokenizer, theirs: Any, tmp_path: Path) -> None:
    theirs.save_pretrained(tmp_path)
    folder = Tokenizer.from_path(tmp_path)
    for text in TEXTS:
        ids = ours.encode(text)
        assert folder.encode(text) == ids and folder.decode(ids) == ours.decode(ids)
    for messages in CONVERSATIONS:
        assert folder.apply_chat_template(messages) == ours.apply_chat_template(messages)
    assert folder.eos_token_ids == ours.eos_token_ids and folder.bos_token_id == ours.bos_token_id
    assert folder.special_token_ids == ours.special_token_ids
    assert folder.token_bytes_table() == ours.token_bytes_table()


# ---- chat template behaviour ------------------------------------------------------------------


def _with_template(ours: Tokenizer, template: str | None) -> Tokenizer:
    return Tokenizer(
        ours._backend,  # sharing the Rust tokenizer is fine: it is never mutated
        chat_template=template,
        eos_token_ids=(2,),
        special_tokens={"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    )


def test_default_template_is_chatml(ours: Tokenizer) -> None:
    tok = _with_template(ours, None)
    got = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert got == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_template_globals_and_errors(ours: Tokenizer) -> None:
    template = (
        "{% if messages[0]['role'] == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}"
        "{{ bos_token }}{% for m in messages %}{{ m['content'] | tojson }}\n{% endfor %}{{ eos_token }}"
    )
    tok = _with_template(ours, template)
    assert tok.apply_chat_template([{"role": "user", "content": "<b>"}]) == '<|im_start|>"<b>"\n<|im_end|>'
    with pytest.raises(ChatTemplateError, match="no bad roles"):
        tok.apply_chat_template([{"role": "bad", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        ours.apply_chat_template([{"role": "user"}])  # no content: `str + undefined`
    with pytest.raises(ChatTemplateError, match="compile"):
        _with_template(ours, "{% for %}")
    sandboxed = _with_template(ours, "{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        sandboxed.apply_chat_template([{"role": "user", "content": "x"}])


# Gemma 2's chat template (as its tokenizer_config.json ships it): no system role
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)


def test_template_without_a_system_role_gets_it_in_the_first_user_turn(ours: Tokenizer) -> None:
    """Gemma 2 raises on a system message: it is folded into the first user turn, the way Gemma 3's
    own template does; a template that takes one (ChatML) keeps it as its own turn."""
    tok = _with_template(ours, GEMMA2_TEMPLATE)
    assert not tok.system_role and _with_template(ours, None).system_role
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    want = (
        "<|im_start|><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    assert tok.apply_chat_template(messages) == want
    assert tok.apply_chat_template(messages[1:]) == want.replace("Be brief.\n\n", "")
    with pytest.raises(ChatTemplateError, match="must alternate"):  # its other rules still hold
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_encode_and_decode_from_two_threads(ours: Tokenizer) -> None:
    expected = {t: ours.encode(t) for t in TEXTS}
    texts = {t: ours.decode(ids) for t, ids in expected.items()}
    failures: list[str] = []

    def encoder() -> None:
        for _ in range(20):
            failures.extend(t for t in TEXTS if ours.encode(t) != expected[t])

    def decoder() -> None:
        for _ in range(20):
            failures.extend(t for t in TEXTS if ours.decode(expected[t]) != texts[t])

    threads = [threading.Thread(target=encoder), threading.Thread(target=decoder)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


# ---- sentencepiece-style GGUF (tokenizer model `llama`) ---------------------------------------


def _write_sentencepiece_gguf(path: Path) -> None:
    pieces = {"▁": -1.0} | dict.fromkeys("abcdefghijklmnopqrstuvwxyzHW,.!", -2.0)
    merged = ["▁t", "he", "▁the", "▁a", "in", "▁in", "ing", "er", "▁w", "or", "▁wor", "ld", "▁world"]
    merged += ["▁h", "ll", "▁he", "▁hell", "▁hello", "▁H", "▁He", "▁Hell", "▁Hello", "▁▁", "▁▁▁▁"]
    pieces |= {p: -3.0 - 0.1 * i for i, p in enumerate(merged)}
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + list(pieces.values()))
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))  # unknown, control, byte, normal
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_sentencepiece_gguf_matches_transformers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    path = tmp_path / "sp.gguf"
    _write_sentencepiece_gguf(path)
    ours = Tokenizer.from_gguf(path)
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    texts = ["Hello world", " Hello  world", "the thing in water", "héllo wörld 😀", "", "  ", "a\nb", "Hi!"]
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        assert ids[0] == 1  # llama-style vocabularies add BOS
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
        # Leading-space rule: decode() drops the space of the first `▁`; the bytes keep it.
        joined = _joined(ours, ids)
        assert joined == ours.decode(ids) or joined == " " + ours.decode(ids), text
    assert ours.token_bytes(3 + 0xF0) == b"\xf0"  # byte-fallback piece <0xF0>
    assert ours.token_bytes(ours.encode("Hello", add_special_tokens=False)[0]) == b" Hello"
