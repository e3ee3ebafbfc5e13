"""Griffe extension: read the package's Sphinx conventions as mkdocstrings' Markdown.

The docstrings use Google sections with Sphinx roles (``:func:`log_z```,
``:class:`~numpyro_uha.core.AnnealingParams```). mkdocstrings reads Markdown, so each role
becomes an autorefs link when its target is a documented ``numpyro_uha`` object (a
broken one then fails ``mkdocs build --strict``), and inline code otherwise. Module
constants documented by ``#:`` comments above them get those comments as docstrings.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")
MATH = re.compile(r":math:`([^`]+)`")
LITERAL = re.compile(r"(?<=\w)::\n")


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """Dotted path of ``target`` as seen from ``obj``'s scope, if it is a package object.

    A field without a docstring of its own (a NamedTuple field, described in its class's
    ``Attributes:`` section) gets no anchor on the page, so it links to its class.
    """
    if target.startswith("numpyro_uha"):
        return target
    scope = obj
    while scope is not None:
        try:
            found = scope[target]
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            scope = scope.parent
            continue
        if found.is_attribute and found.docstring is None and found.parent.is_class:
            found = found.parent
        return found.path
    return None


def _comment_docstring(attr: griffe.Object) -> None:
    """Use the ``#:`` comment lines right above an attribute as its docstring."""
    lines = attr.module.lines
    comment = []
    index = (attr.lineno or 0) - 2
    while index >= 0 and lines[index].lstrip().startswith("#:"):
        comment.insert(0, lines[index].lstrip()[2:].strip())
        index -= 1
    if comment:
        attr.docstring = griffe.Docstring("\n".join(comment), parent=attr)


class SphinxMarkup(griffe.Extension):
    """Rewrite roles, math and literal markers in every docstring; document constants."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.is_alias:
            return  # the target object gets its own call
        if obj.docstring is None and obj.is_attribute:
            _comment_docstring(obj)
        if obj.docstring is None:
            return

        def link(match: re.Match) -> str:
            short, target = match.group(1), match.group(2)
            label = target.rsplit(".", 1)[-1] if short else target
            path = _resolve(obj, target)
            return f"[`{label}`][{path}]" if path else f"`{label}`"

        text = ROLE.sub(link, obj.docstring.value)
        text = MATH.sub(r"*\1*", text)
        # reST's "Example::" introduces a literal block; in Markdown the indented block
        # below is code already, so keep a single colon.
        obj.docstring.value = LITERAL.sub(":\n", text)
