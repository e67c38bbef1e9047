"""Write docs/API.md from the docstrings of the public API (`dapo_trl.__all__`).

For each public name: its signature (for a dataclass, the fields it adds or re-defaults) and the first paragraph of
its docstring; for a class, the same for the public methods it defines. DAPOTrainer's extension points (methods whose
docstring starts with "Extension point") are listed with their whole docstring, since the later paragraphs are the
contract a subclass must keep.

DAPOConfig's settings and MathVerifierReward's arguments also get a reference table. A setting's row is read from the
dataclass (type, default, GRPOConfig's default where it differs), its `help` metadata (the line `--help` prints) and
the paper sections cited by that help or by the heading of its group in the docstring (`> Dynamic sampling (DAPO
§3.2, Algorithm 1)`). An argument's row is read from the signature and its `Args:` entry in the docstring.

```
python scripts/gen_api_docs.py          # rewrite docs/API.md
python scripts/gen_api_docs.py --check  # exit 1 if docs/API.md is out of date
```
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path

from trl import GRPOConfig

import dapo_trl

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "API.md"
MAX_LINE = 100  # longer signatures get one parameter per line
PAPER_REFERENCE = re.compile(r"§\d+(?:\.\d+)*|Eq\. \d+|Algorithm \d+|Table \d+")
# `name (`type`, *optional*, defaults to `value`):` -- TRL's docstring format for one parameter
DOC_PARAMETER = re.compile(r"^(\w+) \(`[^`]*`(?: or `[^`]*`)?(?:, \*optional\*)?(?:, defaults to `[^`]*`)?\):$")


class _Text:
    """Renders a string annotation without quotes (the package uses `from __future__ import annotations`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _annotation(annotation):
    return _Text(annotation) if isinstance(annotation, str) else annotation


def signature(name: str, obj) -> str:
    sig = inspect.signature(obj)
    params = [p.replace(annotation=_annotation(p.annotation)) for p in sig.parameters.values()]
    sig = sig.replace(parameters=params, return_annotation=_annotation(sig.return_annotation))
    text = f"{name}{sig}"
    if len(text) <= MAX_LINE:
        return text
    ret = "" if sig.return_annotation is inspect.Signature.empty else f" -> {sig.return_annotation!r}"
    # Rebuild the parameter list one per line, keeping the `*` and `/` markers that str(Signature) inserts.
    inner = str(sig.replace(return_annotation=inspect.Signature.empty))[1:-1]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    parts.append(inner[start:].strip())
    body = "".join(f"    {part},\n" for part in parts if part)
    return f"{name}(\n{body}){ret}"


def dataclass_fields(cls) -> str:
    """The fields `cls` declares itself (new or with a new default), as a class body."""
    own = cls.__dict__.get("__annotations__", {})
    lines = []
    for field in dataclasses.fields(cls):
        if field.name not in own:
            continue
        annotation = own[field.name] if isinstance(own[field.name], str) else inspect.formatannotation(field.type)
        if field.default is not dataclasses.MISSING:
            lines.append(f"    {field.name}: {annotation} = {field.default!r}")
        elif field.default_factory is not dataclasses.MISSING:
            lines.append(f"    {field.name}: {annotation} = field(default_factory={field.default_factory.__name__})")
        else:
            lines.append(f"    {field.name}: {annotation}")
    bases = ", ".join(base.__name__ for base in cls.__bases__ if base is not object)
    header = f"@dataclass\nclass {cls.__name__}({bases}):" if bases else f"@dataclass\nclass {cls.__name__}:"
    return header + "\n" + ("\n".join(lines) or "    ...")


def own_doc(obj) -> str:
    """The object's own docstring, cleaned (not one inherited from a base class, as `inspect.getdoc` would give)."""
    doc = getattr(obj, "__func__", obj).__doc__  # staticmethod/classmethod wrap the function
    return inspect.cleandoc(doc) if doc else ""


def first_paragraph(obj) -> str:
    """The first paragraph of the docstring, and the next one too when the first ends with a colon (a list follows)."""
    paragraphs = own_doc(obj).split("\n\n")
    out = paragraphs[0]
    if out.endswith(":") and len(paragraphs) > 1:
        out += "\n\n" + paragraphs[1]
    return out.strip()


def code(text: str) -> str:
    return f"```python\n{text}\n```"


def is_extension_point(method) -> bool:
    return own_doc(method).startswith("Extension point")


def public_methods(cls) -> list[tuple[str, object]]:
    """Methods and properties `cls` defines itself that are public and documented (and `__call__`), in source order."""
    out = []
    for name, member in cls.__dict__.items():
        if name.startswith("_") and name != "__call__":
            continue
        if isinstance(member, property | staticmethod | classmethod) or inspect.isfunction(member):
            if own_doc(member) or name == "__call__":
                out.append((name, member))
    return out


def method_entry(cls, name: str, member, *, level: str = "####", full_doc: bool = False) -> str:
    if isinstance(member, property):
        head = f"{cls.__name__}.{name}  # property"
    else:
        head = signature(f"{cls.__name__}.{name}", getattr(cls, name))
    doc = own_doc(member) if full_doc else first_paragraph(member)
    return f"{level} `{cls.__name__}.{name}`\n\n{code(head)}\n" + (f"\n{doc}\n" if doc else "")


# ---------------------------------------------------------------------------------------------------------------------
# Reference tables: DAPOConfig's settings, MathVerifierReward's arguments
# ---------------------------------------------------------------------------------------------------------------------


def docstring_parameters(obj, section: str) -> list[tuple[str, str, str]]:
    """(group heading, name, description) of each entry of the `section` block ("Parameters:", "Args:") of a docstring.

    Group headings are TRL's `> Heading` lines inside the block; the description is the entry's indented text on one
    line.
    """
    lines = own_doc(obj).splitlines()
    start = lines.index(section) + 1
    out: list[tuple[str, str, str]] = []
    group = ""
    for line in lines[start:]:
        if line and not line.startswith(" "):
            break  # the next section (Example:, ...)
        text = line.strip()
        if line.startswith("    > "):
            group = text[2:]
        elif (match := DOC_PARAMETER.match(text)) and not line.startswith("        "):
            out.append((group, match.group(1), ""))
        elif text and out and line.startswith("        "):
            group_, name, description = out[-1]
            out[-1] = (group_, name, f"{description} {text}".strip())
    return out


def paper_sections(*texts: str) -> str:
    """The paper references (§, Eq., Algorithm, Table) cited by the texts, in order, without repeats."""
    found = [ref for text in texts for ref in PAPER_REFERENCE.findall(text)]
    return ", ".join(dict.fromkeys(found)) or "-"


def cell(text: str) -> str:
    """Text for a table cell: pipes escaped, and `<name>` outside code spans kept from being read as an HTML tag."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def settings_table(cls=None, base=GRPOConfig) -> str:
    """The reference table of the settings a config dataclass declares itself, grouped as its docstring groups them."""
    cls = cls or dapo_trl.DAPOConfig
    own = cls.__dict__.get("__annotations__", {})
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name in own}
    base_defaults = {f.name: f.default for f in dataclasses.fields(base)}
    documented = docstring_parameters(cls, "Parameters:")
    groups: dict[str, list[str]] = {}
    redefaulted = [name for name in fields if name in base_defaults]
    if redefaulted:
        groups[f"Defaults that differ from {base.__name__}'s"] = redefaulted
    for group, name, _ in documented:
        if name in fields and name not in redefaulted:
            groups.setdefault(group, []).append(name)
    undocumented = [name for name in fields if not any(name in names for names in groups.values())]
    if undocumented:
        raise ValueError(f"{cls.__name__} fields missing from its docstring's Parameters: {undocumented}")
    header = (
        f"| setting | type | default | {base.__name__}'s default | what it does | paper |\n|---|---|---|---|---|---|"
    )
    out = []
    for group, names in groups.items():
        rows = []
        for name in names:
            field = fields[name]
            annotation = own[name] if isinstance(own[name], str) else inspect.formatannotation(field.type)
            help_text = field.metadata.get("help", "")
            if not help_text:
                raise ValueError(f"{cls.__name__}.{name} has no `help` metadata")
            theirs = f"`{base_defaults[name]!r}`" if name in base_defaults else "(new)"
            rows.append(
                f"| `{name}` | `{cell(annotation)}` | `{field.default!r}` | {theirs} | {cell(help_text)} "
                f"| {paper_sections(group, help_text)} |"
            )
        out.append(f"**{group}**\n\n{header}\n" + "\n".join(rows))
    return "\n\n".join(out)


def arguments_table(cls=None) -> str:
    """The reference table of a class's constructor arguments: signature (type, default) and its `Args:` entries."""
    cls = cls or dapo_trl.MathVerifierReward
    parameters = {
        name: p for name, p in inspect.signature(cls.__init__).parameters.items() if name not in ("self", "args")
    }
    described = {name: description for _, name, description in docstring_parameters(cls, "Args:")}
    if set(described) != set(parameters):
        raise ValueError(
            f"{cls.__name__}: arguments {sorted(parameters)} but its docstring's Args: {sorted(described)}"
        )
    rows = ["| argument | type | default | what it does | paper |", "|---|---|---|---|---|"]
    for name, p in parameters.items():
        default = "(required)" if p.default is inspect.Parameter.empty else f"`{p.default!r}`"
        rows.append(
            f"| `{name}` | `{cell(str(_annotation(p.annotation)))}` | {default} | {cell(described[name])} "
            f"| {paper_sections(described[name])} |"
        )
    return "\n".join(rows)


REFERENCE_TABLES = {
    "DAPOConfig": (
        "settings",
        "Every setting DAPOConfig adds or gives a new default; all of GRPOConfig's others are accepted unchanged. "
        "The `--help` of `examples/train_math.py` prints the same help lines. *paper*: the section of arXiv 2503.14476 "
        "the setting implements (- where the paper has no such setting).",
        settings_table,
    ),
    "MathVerifierReward": ("arguments", "Keyword-only arguments of the constructor.", arguments_table),
}


def entry(name: str, obj) -> str:
    parts = [f"### `{name}`\n"]
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        parts.append(code(dataclass_fields(obj)))
    elif inspect.isclass(obj):
        bases = ", ".join(base.__name__ for base in obj.__bases__ if base is not object)
        parts.append(code((f"class {name}({bases})\n" if bases else "") + signature(name, obj)))
    else:
        parts.append(code(signature(name, obj)))
    parts.append(f"\n{first_paragraph(obj)}\n")
    if name in REFERENCE_TABLES:
        what, lead, table = REFERENCE_TABLES[name]
        parts.append(f"#### `{name}` {what}\n\n{lead}\n\n{table()}\n")
    if inspect.isclass(obj):
        methods = public_methods(obj)
        regular = [(n, m) for n, m in methods if not is_extension_point(m)]
        extension = [(n, m) for n, m in methods if is_extension_point(m)]
        parts += [method_entry(obj, n, m) for n, m in regular]
        if extension:
            parts.append(
                f"#### Extension points of `{name}`\n\nOverride these in a subclass to change its behaviour.\n"
            )
            parts += [method_entry(obj, n, m, level="#####", full_doc=True) for n, m in extension]
    return "\n".join(parts)


def render() -> str:
    """The whole of docs/API.md."""
    names = [name for name in dapo_trl.__all__ if not name.startswith("_")]
    modules: dict[str, list[str]] = {}
    for name in names:
        modules.setdefault(getattr(dapo_trl, name).__module__, []).append(name)
    # Modules in the order the package docstring introduces them: that of the lazy-export table.
    order = list(dict.fromkeys(f"dapo_trl.{module}" for module in dapo_trl._EXPORTS.values()))
    out = [
        "# API reference\n",
        f"`dapo_trl` {dapo_trl.__version__}: the names in `dapo_trl.__all__`, importable as `from dapo_trl import "
        "<name>`. Generated from the docstrings by `python scripts/gen_api_docs.py`; edit the docstrings, not this "
        "file.\n",
    ]
    for module in sorted(modules, key=lambda m: order.index(m) if m in order else len(order)):
        out.append(f"## `{module}`\n\n{first_paragraph(sys.modules[module])}\n")
        out += [entry(name, getattr(dapo_trl, name)) for name in modules[module]]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/API.md from the public docstrings.")
    parser.add_argument("--check", action="store_true", help="Exit 1 if docs/API.md is out of date; write nothing.")
    options = parser.parse_args(argv)
    text = render()
    if options.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is out of date: run python scripts/gen_api_docs.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
