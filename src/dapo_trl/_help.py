"""
The `--help` text of each DAPOConfig setting, generated from one source: the class docstring.

Each parameter of DAPOConfig's docstring (TRL's format, `name (`type`, *optional*, defaults to `x`):` then an indented
description, under a `> Heading` line) is the setting's documentation; [`apply_docstring_help`] makes its first
sentence (and, for a setting whose default is `None`, the sentence saying what `None` means) the field's `help`
metadata, which is what [`~trl.TrlParser`] prints and what `scripts/gen_api_docs.py` tabulates. The fields declare no
help of their own, so the two cannot disagree; [`help_source_problems`] (run by `tests/test_help.py`) finds a field
without an entry, a field that writes its own help, and a stated default that is not the field's.
"""

from __future__ import annotations

import dataclasses
import re
import types
from dataclasses import dataclass

# `name (`type`, *optional*, defaults to `value`):` -- TRL's docstring format for one parameter
_ENTRY = re.compile(r"^(\w+) \(`[^`]*`(?: or `[^`]*`)?(?:, \*optional\*)?(?:, defaults to `(?P<default>[^`]*)`)?\):$")
_HEADING = re.compile(r"^> (?P<title>.+)$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"(\[])")


@dataclass(frozen=True)
class ParameterDoc:
    """One parameter of a docstring: its group heading, its description and the default it states (or `None`)."""

    name: str
    heading: str
    description: str
    default: str | None


def parameter_docs(docstring: str) -> dict[str, ParameterDoc]:
    """
    The parameters of a TRL-format docstring's `Parameters:` section, in order.

    Example:
    ```python
    >>> docs = parameter_docs('''
    ...     Parameters:
    ...         > Shaping (§3.4)
    ...
    ...         buffer (`int`, *optional*, defaults to `4`):
    ...             Tokens before the cap. More text.
    ... ''')
    >>> docs["buffer"]
    ParameterDoc(name='buffer', heading='Shaping (§3.4)', description='Tokens before the cap. More text.', default='4')

    ```
    """
    lines = docstring.expandtabs().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Parameters:"), None)
    if start is None:
        return {}
    docs: dict[str, ParameterDoc] = {}
    heading, name, default, text = "", None, None, []

    def close() -> None:
        if name is not None:
            docs[name] = ParameterDoc(name, heading, " ".join(text), default)

    for line in lines[start + 1 :]:
        stripped = line.strip()
        if (match := _HEADING.match(stripped)) is not None:
            close()
            heading, name, text = match["title"], None, []
        elif (match := _ENTRY.match(stripped)) is not None:
            close()
            name, default, text = match[1], match["default"], []
        elif stripped and name is not None:
            text.append(stripped)
    close()
    return docs


def help_text(doc: ParameterDoc, *, default_is_none: bool) -> str:
    """
    The `--help` line of a documented parameter: its first sentence, plus the sentence that says what its default
    means when the field's default is `None` (argparse then prints "default: None"), as plain text (no backticks,
    links or LaTeX).

    Example:
    ```python
    >>> doc = ParameterDoc("n", "", "Length $L_{\\\\text{cache}}$ of the zone. Must be positive. Defaults to `m // 5`.", None)
    >>> help_text(doc, default_is_none=True)
    'Length L_cache of the zone. Defaults to m // 5.'

    ```
    """
    sentences = _SENTENCE_END.split(doc.description)
    chosen = sentences[:1]
    if default_is_none:
        chosen += [s for s in sentences[1:] if s.startswith("Defaults to")][:1]
    return plain_text(" ".join(chosen))


def apply_docstring_help(cls: type) -> None:
    """Set the `help` metadata of every field `cls` declares itself (new or re-defaulted) from its docstring entry."""
    docs = parameter_docs(cls.__doc__ or "")
    for field in _own_fields(cls):
        if field.name in docs:
            text = help_text(docs[field.name], default_is_none=field.default is None)
            field.metadata = types.MappingProxyType({**field.metadata, "help": text})


def help_source_problems(cls: type) -> list[str]:
    """
    What keeps the docstring of `cls` from being the one source of its settings' help: a field `cls` declares without
    a docstring entry, a help the field writes itself, or a default the entry states that is not the field's.
    """
    import ast

    docs = parameter_docs(cls.__doc__ or "")
    problems = []
    for field in _own_fields(cls):
        doc = docs.get(field.name)
        if doc is None:
            problems.append(f"{field.name}: no entry in the class docstring")
            continue
        if field.metadata.get("help") != help_text(doc, default_is_none=field.default is None):
            problems.append(f"{field.name}: the field writes its own help; write it in the class docstring")
        if doc.default is not None:
            try:
                stated = ast.literal_eval(doc.default)
            except (ValueError, SyntaxError):
                stated = doc.default
            if stated != field.default:
                problems.append(
                    f"{field.name}: the docstring says defaults to {doc.default}, the field {field.default!r}"
                )
    return problems


def _own_fields(cls: type) -> list[dataclasses.Field]:
    own = cls.__dict__.get("__annotations__", {})
    return [field for field in dataclasses.fields(cls) if field.name in own]


def plain_text(text: str) -> str:
    """Docstring markup as plain text: no backticks, links or LaTeX."""
    text = re.sub(r"\[`~?(?:[\w.]+\.)?(\w+)`\]", r"\1", text)  # [`~trl.GRPOConfig`] -> GRPOConfig
    text = re.sub(r"\$([^$]*)\$", lambda m: re.sub(r"\\text|[{}]", "", m[1]), text)  # $L_{\text{cache}}$ -> L_cache
    return text.replace("`", "")
