"""Untrusted text made safe for each place it is shown: the one module that does it.

Strings from a result file, an expectation file, a file name or a remote peer are data, never
instructions to the terminal, the markdown renderer, the browser or matplotlib; each is passed
through one of these functions once, where it is rendered. ``term`` shows control characters, DEL
and the Unicode bidirectional overrides (CVE-2021-42574, "Trojan Source") as Python escapes; the
others apply ``term`` first. Each takes any object (``str()`` of it is used) and never raises.
"""

from __future__ import annotations

import html as _html
import re
import unicodedata

__all__ = ["term", "term_markup", "markdown", "html", "mpl", "MAX_SHOWN"]

MAX_SHOWN = 512  # longest string shown in one place; longer ones are cut, their length said

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
    """``s`` as one printable line: unsafe characters as Python escapes, cut to ``limit`` characters."""
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


# the characters markdown reads as syntax, backslash-escaped (CommonMark "backslash escapes")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]#|~])")


# What GitHub acts on in plain text (mentions, issue references, GFM spec 6.9 autolinks), broken by
# a zero-width space after the trigger
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
    """``s`` safe as a matplotlib label: one line, no mathtext (``$`` escaped, matplotlib's mathtext)."""
    return term(s, limit).replace("$", r"\$")
