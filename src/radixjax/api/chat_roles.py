"""Chat roles as text: each role's (prefix, suffix) around its content, read off the
model's own chat template, so `s += user("hi")` writes what the template would.

    role_markers(tokenizer) -> {"system": (prefix, suffix), "user": ..., "assistant": ...}

The server publishes these in /get_model_info ("chat_role_markers"), so the HTTP backend
writes the same text as the in-process one without the tokenizer.
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant")
_CONTENT = "<<radixjax-role-content>>"
# ChatML, for a server that does not publish its markers (a plain SGLang server).
CHATML = {role: (f"<|im_start|>{role}\n", "<|im_end|>\n") for role in ROLES}


def role_markers(tokenizer: Any) -> dict[str, tuple[str, str]]:
    """Each role's text before and after its content, from the tokenizer's template.
    Roles after the first are rendered after a system message, so a template's default
    system prompt (added when none is given) is not mistaken for part of a role."""
    def render(messages: list[dict]) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False)

    def split(text: str) -> tuple[str, str]:
        before, after = text.split(_CONTENT)
        return before, after

    markers = {"system": split(render([{"role": "system", "content": _CONTENT}]))}
    base = render([{"role": "system", "content": "x"}])
    for role in ("user", "assistant"):
        text = render([{"role": "system", "content": "x"}, {"role": role, "content": _CONTENT}])
        if not text.startswith(base):
            raise ValueError(f"cannot read the {role} role off this chat template")
        markers[role] = split(text[len(base):])
    return markers
