"""Chat templates' behaviour: ChatML when a model has none, the globals a template sees and the
errors it raises (also under the sandbox), and a template without a system role (Gemma 2's) gets
the system message in the first user turn."""

from __future__ import annotations

import pytest
from rillet.core.tokenizer.chat_template import ChatTemplateError, fold_system_message
from rillet.core.tokenizer.tokenizer import Tokenizer


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


def test_a_folded_system_message_goes_before_a_vision_turns_parts() -> None:
    """A user turn with images is a list of parts (core/vision/front.py): the system text becomes
    its first text part, the image entries stay as they are."""
    image = {"type": "image"}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [image, {"type": "text", "text": "?"}]},
    ]
    assert fold_system_message(messages) == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Be brief.\n\n"}, image, {"type": "text", "text": "?"}],
        }
    ]
