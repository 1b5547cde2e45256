"""Untrusted text made safe for each place it is shown: the one module that does it.

Strings that come from a result file, a TOML expectation file, a file name or a remote peer (a net
server, another rank) are data, never instructions to the terminal, the markdown renderer, the
browser or matplotlib. Every place that shows such a string passes it through one of these functions
exactly once, at the point where it is rendered:

- ``term(s)``: a terminal line. C0/C1 control characters (ESC, so no ANSI colour, screen clear or
  OSC 8 hyperlink; CR and LF, so no fake output line), DEL and the Unicode bidirectional overrides
  (CVE-2021-42574, "Trojan Source") are shown as their Python escapes (``\\x1b``, ``\\n``,
  ``\\u202e``). The result is plain text: hand it to rich as ``rich.text.Text`` or through
  ``term_markup`` where a markup string is built.
- ``term_markup(s)``: ``term(s)`` with rich markup escaped (``[bold]`` shows as written; ``[/]``
  cannot raise MarkupError).
- ``markdown(s)``: one table cell or inline text of GitHub-flavoured markdown: ``term`` first, then
  HTML special characters as entities (no raw ``<img onerror=...>``), and the characters markdown
  reads as syntax (``|`` would add a column, backticks, ``*``, ``_``, ``[``, ``]``, ``#``, ``~``, ``\\``) backslash-escaped, per the CommonMark spec's "backslash escapes" (any ASCII punctuation);
  then what GitHub acts on in text (``@name``, ``#12``, ``GH-12``, ``http://``, ``www.``) broken by
  a zero-width space.
- ``html(s)``: text or an attribute value in HTML: ``term`` first, then ``html.escape(quote=True)``.
- ``mpl(s)``: a matplotlib label or title: ``term`` first, then ``$`` escaped so no mathtext is
  parsed (matplotlib's "Text rendering with mathtext": an unescaped pair of ``$`` starts math mode,
  and a bad expression raises ValueError at draw time).

Each function takes any object (``str()`` of it is used), so a number or ``None`` read from a file
where a string was expected is shown, not raised on.
"""

from __future__ import annotations

import html as _html
import re
import unicodedata

__all__ = ["term", "term_markup", "markdown", "html", "mpl", "MAX_SHOWN"]

#: Longest string shown in one place; longer ones are cut with an ellipsis and their length. A
#: 10 MB "command" in a result file must not become a 10 MB terminal line.
MAX_SHOWN = 512

# Bidirectional formatting characters (Unicode TR9): embeddings, overrides, isolates, marks.
_BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _unsafe(c: str) -> bool:
    if c in _BIDI:
        return True
    cat = unicodedata.category(c)
    # Cc: C0, DEL, C1 controls; Cf: other format characters (zero-width joiners are harmless but
    # invisible, so show them too); Zl/Zp: line and paragraph separators (U+2028/9) break lines.
    return cat in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


def term(s: object, limit: int = MAX_SHOWN) -> str:
    """``s`` as one printable line: unsafe characters as Python escapes, cut to ``limit`` characters.

    Shape: any object in, ``str`` out; never raises."""
    text = s if isinstance(s, str) else str(s)
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text)} characters)"
    if text.isprintable() and not any(c in _BIDI for c in text):
        return text
    return "".join(repr(c)[1:-1] if _unsafe(c) else c for c in text)


def term_markup(s: object, limit: int = MAX_SHOWN) -> str:
    """``term(s)`` with rich console markup escaped, for a string that rich will parse as markup."""
    from rich.markup import escape

    return escape(term(s, limit))


# CommonMark: any ASCII punctuation character may be backslash-escaped. Escape those markdown
# gives meaning inline or in a table cell (emphasis, code, links and images, the cell separator,
# strikethrough, a heading); '<', '>' and '&' become entities instead.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]#|~])")


# What GitHub acts on in plain text: "@name" mentions, "#12" and "GH-12" issue references, GFM's
# extended autolinks (GFM spec, section 6.9: "http://", "www.", "a@b.example"). A zero-width space
# written as the entity &#8203; after the trigger breaks each, invisibly (as Renovate does).
_ZWSP = "&#8203;"
_MD_TRIGGERS = re.compile(r"(@)(?=[0-9A-Za-z_-])|(#|GH-)(?=[0-9])|(:)(?=//)|\b(www)(?=\.)", re.IGNORECASE)


def markdown(s: object, limit: int = MAX_SHOWN) -> str:
    """``s`` safe as inline markdown or a table cell: no raw HTML, no new rows, no links or code,
    and nothing GitHub acts on (no @mention, #issue reference or bare-URL autolink)."""
    text = _html.escape(term(s, limit), quote=True)
    return _MD_TRIGGERS.sub(r"\g<0>" + _ZWSP, _MD_SPECIAL.sub(r"\\\1", text))


def html(s: object, limit: int = MAX_SHOWN) -> str:
    """``s`` safe as HTML text or a quoted attribute value."""
    return _html.escape(term(s, limit), quote=True)


def mpl(s: object, limit: int = 120) -> str:
    """``s`` safe as a matplotlib label: one line, no mathtext (``$`` escaped)."""
    return term(s, limit).replace("$", r"\$")
