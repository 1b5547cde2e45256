"""core.safe: every hostile payload (ANSI and OSC 8 escapes, CR/LF, bidi controls, rich markup, HTML)
made inert in every output."""

import re

import pytest
from rich.console import Console
from rich.text import Text

from gpubench.core import safe

PAYLOADS = [
    "\x1b[2J",  # clear screen
    "\x1b[31mred\x1b[0m",
    "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",  # OSC 8 hyperlink
    "ok\rFAKE LINE",
    "two\nlines",
    "\u202eevil",  # right-to-left override
    "\x9b31m",  # C1 CSI
    "line\u2028sep",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_term_leaves_no_control_character(payload):
    out = safe.term(payload)
    assert out.isprintable(), repr(out)
    assert "\u202e" not in out and "\x1b" not in out


@pytest.mark.parametrize("payload", PAYLOADS + ["[bold red]x[/]", "[/]", "[link=http://e/]x"])
def test_rich_shows_the_payload_as_written(payload):
    console = Console(record=True, force_terminal=True, color_system="truecolor", width=200)
    console.print(safe.term_markup(payload))
    console.print(Text(safe.term(payload)))
    raw = console.export_text(styles=True)
    # The only escape sequences are rich's own reset codes, never the payload's.
    assert "\x1b[2J" not in raw and "\x1b]8" not in raw and "\x1b[31m" not in raw
    assert "\r" not in raw


def test_markdown_cannot_add_html_rows_or_links():
    out = safe.markdown("<img src=x onerror=alert(1)>|new|cell\n| row |[link](http://e) `code`")
    assert "<" not in out and ">" not in out
    assert "\n" not in out
    assert "|" not in out.replace("\\|", "")
    assert "\\[" in out and "\\`" in out


GITHUB_TRIGGERS = ["@someone", "host @org/team", "see #12", "GH-34", "http://evil.example/x",
                   "https://evil.example", "www.evil.example", "ops@evil.example", "HTTPS://EVIL.EXAMPLE",
                   "WWW.EVIL.EXAMPLE", "[x](http://e) <http://e> `@a` *#1*"]


@pytest.mark.parametrize("payload", GITHUB_TRIGGERS)
def test_markdown_leaves_github_no_mention_reference_or_autolink(payload):
    # rendered by cmark-gfm with GitHub's extensions (the renderer of GitHub's comments), as one
    # cell of the table compare writes: no link, code or emphasis; the text reads as written, and
    # a zero-width space breaks each "@name", "#12", "GH-12", "://" and "www."
    import html

    cmarkgfm = pytest.importorskip("cmarkgfm")
    rendered = cmarkgfm.github_flavored_markdown_to_html(f"| a | b |\n| --- | --- |\n| {safe.markdown(payload)} | x |\n")
    assert "<a " not in rendered and "<code>" not in rendered and "<em>" not in rendered, rendered
    text = html.unescape(re.sub(r"<[^>]+>", "", rendered))
    assert payload in text.replace("\u200b", ""), text
    assert not re.search(r"@[0-9A-Za-z_-]|#[0-9]|GH-[0-9]|://|www\.", text, re.IGNORECASE), text


def test_html_escapes_tags_and_quotes():
    assert safe.html('<script>"x"</script>') == "&lt;script&gt;&quot;x&quot;&lt;/script&gt;"


def test_mpl_has_no_mathtext():
    matplotlib = pytest.importorskip("matplotlib")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_title(safe.mpl(r"$\foo$ and $x^$"))
    fig.canvas.draw()  # raises ValueError on bad mathtext without the escape
    plt.close(fig)


def test_long_strings_are_cut_and_say_so():
    out = safe.term("x" * 100_000)
    assert len(out) < 600 and "100000 characters" in out


def test_non_strings_are_shown_not_raised_on():
    assert safe.term(None) == "None"
    assert safe.markdown(3.5) == "3.5"
