"""A griffe extension for the API reference: the package's reST markup, as Markdown.

The docstrings are written for ``help()`` and Sphinx-style readers: roles such as
``:class:`~guard.policy.Limits``` and literal blocks introduced by ``::``. mkdocstrings
renders docstrings as Markdown, where both would show as typed. This turns a role into inline
code (the last dotted part when the target starts with ``~``) and ``::`` into ``:``, so the
block after it reads as the code block it is.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`<]*?)(?:\s*<[^`>]*>)?`")
_LITERAL = re.compile(r"(\S)::$", re.MULTILINE)
_LONE_LITERAL = re.compile(r"^(\s*)::$", re.MULTILINE)


def _role(m: re.Match[str]) -> str:
    tilde, target = m.group(1), m.group(2).strip()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def markdown(text: str) -> str:
    text = _ROLE.sub(_role, text)
    text = _LONE_LITERAL.sub("", text)
    return _LITERAL.sub(r"\1:", text)


class ReSTRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
