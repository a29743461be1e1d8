"""Reading PowerShell scripts without PowerShell: tree-sitter-pwsh syntax trees.

No real pwsh exists for this Linux machine (shared/WINDOWS_PROXY.md), so the scripts are checked by
parsing: a script with an ERROR or MISSING node does not parse, and the script-level param() block
and hashtable literals are read from the tree to compare serve.ps1 with `winport serve`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import tree_sitter_pwsh
from tree_sitter import Language, Node, Parser

_PARSER = Parser(Language(tree_sitter_pwsh.language()))


def parse(source: bytes) -> Node:
    """Root node of the syntax tree."""
    return _PARSER.parse(source).root_node


def _walk(node: Node) -> Iterator[Node]:
    yield node
    for child in node.children:
        yield from _walk(child)


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


def syntax_problems(source: bytes) -> list[str]:
    """One line per ERROR or MISSING node: 'line:column: what', empty when the script parses."""
    problems = []
    for node in _walk(parse(source)):
        if node.type == "ERROR" or node.is_missing:
            line, col = node.start_point
            what = f"missing {node.type!r}" if node.is_missing else f"cannot parse {_text(node)[:60]!r}"
            problems.append(f"{line + 1}:{col + 1}: {what}")
    return problems


def _unquote(node: Node) -> str:
    """Value of a string literal node (or the text of anything else)."""
    return _unquote_text(_text(node).strip())


def _unquote_text(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


@dataclass
class ScriptParameter:
    """One parameter of a param() block, as declared."""

    name: str
    type: str | None = None  # e.g. 'string', 'switch', 'int', 'double'
    validate_set: list[str] | None = None
    aliases: list[str] = field(default_factory=list)
    attributes: dict[str, str] = field(default_factory=dict)  # [Parameter(...)] arguments, merged

    @property
    def is_switch(self) -> bool:
        """Declared [switch]."""
        return (self.type or "").lower() == "switch"


def _attribute_arguments(attr: Node) -> list[Node]:
    args = next((c for c in attr.children if c.type == "attribute_arguments"), None)
    return [] if args is None else [c for c in args.children if c.type == "attribute_argument"]


def _strings_in(node: Node) -> list[str]:
    return [_unquote(n) for n in _walk(node) if n.type == "string_literal"]


def script_parameters(source: bytes) -> list[ScriptParameter]:
    """The parameters of the script's own param() block (not those of its functions)."""
    root = parse(source)
    block = next((n for n in root.children if n.type == "param_block"), None)
    if block is None:
        return []
    plist = next((c for c in block.children if c.type == "parameter_list"), None)
    out: list[ScriptParameter] = []
    for sp in [] if plist is None else [c for c in plist.children if c.type == "script_parameter"]:
        var = next(c for c in sp.children if c.type == "variable")
        param = ScriptParameter(name=_text(var).lstrip("$"))
        attrs = next((c for c in sp.children if c.type == "attribute_list"), None)
        for attr in [] if attrs is None else [c for c in attrs.children if c.type == "attribute"]:
            type_lit = next((c for c in attr.children if c.type == "type_literal"), None)
            if type_lit is not None:
                param.type = _text(type_lit).strip("[]")
                continue
            name_node = next(c for c in attr.children if c.type == "attribute_name")
            name = _text(name_node).lower()
            args = _attribute_arguments(attr)
            if name == "validateset":
                param.validate_set = [s for a in args for s in _strings_in(a)]
            elif name == "alias":
                param.aliases = [s for a in args for s in _strings_in(a)]
            elif name == "parameter":
                for a in args:
                    key = next((c for c in a.children if c.type == "simple_name"), None)
                    if key is not None:
                        value = _text(a).split("=", 1)[1].strip() if "=" in _text(a) else "$true"
                        param.attributes[_text(key)] = _unquote_text(value)
        out.append(param)
    return out


def hashtable(source: bytes, variable: str) -> dict[str, str]:
    """Entries of the hashtable literal assigned to $variable (keys and string values as written)."""
    for node in _walk(parse(source)):
        if node.type != "assignment_expression":
            continue
        left = next((c for c in node.children if c.type == "left_assignment_expression"), None)
        if left is None or _text(left).strip().lower() != f"${variable}".lower():
            continue
        table = next((n for n in _walk(node) if n.type == "hash_literal_expression"), None)
        if table is None:
            continue
        entries = {}
        for entry in (n for n in _walk(table) if n.type == "hash_entry"):
            key = next(c for c in entry.children if c.type == "key_expression")
            value = entry.children[-1]
            entries[_text(key)] = _unquote(value)
        return entries
    raise KeyError(f"no hashtable literal assigned to ${variable}")


def _assigned_value(source: bytes, variable: str) -> Node:
    for node in _walk(parse(source)):
        if node.type != "assignment_expression":
            continue
        left = next((c for c in node.children if c.type == "left_assignment_expression"), None)
        if left is not None and _text(left).strip().lower() == f"${variable}".lower():
            return next(c for c in node.children if c.type == "assignment_value")
    raise KeyError(f"${variable} is never assigned")


def here_string(source: bytes, variable: str) -> str:
    """Body of the verbatim here-string (@' ... '@) assigned to $variable."""
    text = _text(_assigned_value(source, variable)).strip()
    if not (text.startswith("@'") and text.endswith("'@")):
        raise ValueError(f"${variable} is not assigned a verbatim here-string")
    return text[2:-2].strip("\r\n")


def script_attributes(source: bytes) -> str:
    """Text of the attributes above the script's param() block, e.g. [CmdletBinding(...)]."""
    block = next((n for n in parse(source).children if n.type == "param_block"), None)
    attrs = None if block is None else next((c for c in block.children if c.type == "attribute_list"), None)
    return "" if attrs is None else _text(attrs)


def comment_help(source: bytes) -> str:
    """The first block comment (<# ... #>): comment-based help when it precedes param()."""
    text = source.decode("utf-8", "replace")
    start = text.find("<#")
    end = text.find("#>", start)
    return "" if start < 0 or end < 0 else text[start + 2:end]
