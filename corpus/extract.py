"""Text extraction of the corpus stage: the paragraphs of a documentation file, as plain text.

These are the rules by which the corpus stage turns Debian's translated documentation (HTML help,
man pages, plain text and reStructuredText, GNOME Mallard pages) into the general text that Yi et
al. 2024's pretrain reads (see the issue "Drafters pretrained on real text"). Every format yields a
list of blocks (paragraphs, headings, list items); whitespace inside a block collapses to single
spaces, except that a line break between two CJK characters (Chinese, Japanese; not Hangul, which
separates words with spaces) joins them without a space. Empty blocks are dropped.

- html (also XHTML, Mallard and DocBook XML): a block ends at a block-level tag (p, div, li, h1-h6,
  td, th, dt, dd, br, tr, section, article, blockquote...); inline tags (a, b, em, span...) do not
  break a block; entities are decoded; inline ``code`` keeps its text (it is part of the sentence).
  Skipped with everything inside them: title, head, script, style, pre (code blocks), nav, noscript,
  svg, math, header, footer, aside, form controls, ``info``/``*info`` metadata (Mallard, DocBook),
  elements with an ARIA chrome role (navigation, banner, search...) and elements whose class, or id,
  has a word starting with nav, menu, header, footer, breadcrumb, search or toc (the ids of
  sections, pages and headings are not looked at: they name their content, as in "files-search").
  Malformed markup is tolerated: unclosed elements close with their parent, implied end tags close
  p/li/dt/dd/tr/td/th, stray end tags are ignored and void elements (br, img, meta...) never open
  anything.
- roff (man macros, mdoc lightly): ``.SH``/``.SS``/``.Sh``/``.Ss`` arguments are a block of their
  own; ``.B .I .SM .SB .Nd`` give their arguments, ``.BR .IR .RB .RI .BI .IB`` their arguments
  joined without spaces; ``.TP .TQ .PP .LP .P .IP .HP .sp .br .RS .RE .in .ti .Pp .It .Bl .El`` and
  blank lines break paragraphs (``.IP`` keeps a tag that is not a bullet as the paragraph's start);
  ``.nf``-``.fi``, ``.EX``-``.EE`` and ``.Bd -literal``-``.Ed`` (code) and ``.de``/``.ig`` bodies
  are dropped; every other request line (``.TH``, ``.so``, comments...) is dropped. Escapes: font
  changes, sizes, motions and registers vanish; named glyphs (``\\(em``, ``\\[bu]``, ``\\(:a``...)
  become their characters; the usual strings of man and Pod::Man (``\\*(lq``, ``\\*(Aq``...) their
  text, others nothing; ``\\-`` is ``-``, ``\\e`` a backslash; ``\\c`` joins lines.
- text (plain text, reStructuredText): paragraphs are separated by blank lines; rule lines made only
  of punctuation or symbols (rst under- and overlines) end a paragraph and are dropped; rst explicit
  markup lines (``.. ``) are dropped, with the indented bodies of code directives and comments, the
  option lines of other directives, and the indented literal block after a ``::``.
"""

from __future__ import annotations

import codecs
import gzip
import re
import unicodedata
import zlib
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import Path

from polyspec.errors import PolyspecError

FORMATS = ("html", "roff", "text")

# --- shared ---------------------------------------------------------------------------------------

_WS = re.compile(r"\s+")


def _is_cjk(c: str) -> bool:
    """A wide character of a script written without spaces between words (Han, kana; Hangul is
    not)."""
    if not c or unicodedata.east_asian_width(c) not in ("W", "F"):
        return False
    cp = ord(c)
    hangul = 0x1100 <= cp <= 0x11FF or 0x3130 <= cp <= 0x318F or 0xAC00 <= cp <= 0xD7AF
    return not hangul


def _collapse(s: str) -> str:
    """Whitespace runs → one space, stripped; a run with a line break between two CJK characters →
    nothing."""

    def space(m: re.Match[str]) -> str:
        before = s[m.start() - 1] if m.start() > 0 else ""
        after = s[m.end()] if m.end() < len(s) else ""
        return "" if "\n" in m.group() and _is_cjk(before) and _is_cjk(after) else " "

    return _WS.sub(space, s).strip()


# --- HTML -----------------------------------------------------------------------------------------

_VOID = frozenset(
    "area base basefont br col embed hr img input keygen link meta param source track wbr".split()
)
_BLOCK = frozenset(
    """p div li ul ol dl dt dd h1 h2 h3 h4 h5 h6 td th tr table caption section article blockquote
    br hr body html main header footer aside address figure figcaption details summary fieldset
    legend center
    page item list terms tree steps note desc example quote
    para simpara formalpara listitem term entry row chapter sect1 sect2 sect3 sect4 sect5 refsect1
    refsect2 refsect3 tip warning caution important""".split()
)
_SKIP = frozenset(
    """title head script style pre nav noscript svg math header footer aside template select
    textarea button iframe object canvas screen programlisting synopsis comment""".split()
)
# Word starts (after a non-alphanumeric or a lower→upper case change) that mark page chrome in
# class/id.
_CHROME = re.compile(
    r"(?:^|[^A-Za-z0-9]|(?<=[a-z])(?=[A-Z]))(?i:nav|menu|header|footer|breadcrumb|search|toc)"
)
_NEVER_CHROME = frozenset(("html", "body"))
# Where an id names the content (made from a heading or a page name: "files-search",
# "search-and-replace"), it says nothing about chrome: sections, pages, headings, anchors, and divs
# whose class marks a section.
_ID_NAMES_CONTENT = frozenset("main article section page chapter a h1 h2 h3 h4 h5 h6".split())
_SECTION_CLASS = re.compile(r"(?:^|\s)(?:section|sect\d|chapter|refsect\d|appendix)(?:\s|$)")
_CHROME_ROLES = frozenset(
    ("navigation", "banner", "contentinfo", "search", "menu", "menubar", "toolbar")
)
# An opening tag closes the nearest open element of `closes`, unless an element of `stops` comes
# first.
_LIST_SCOPE = frozenset(("ul", "ol", "menu"))
_TABLE_SCOPE = frozenset(("table", "tbody", "thead", "tfoot"))
_IMPLIED: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "li": (frozenset(("li",)), _LIST_SCOPE),
    "dt": (frozenset(("dt", "dd")), frozenset(("dl",))),
    "dd": (frozenset(("dt", "dd")), frozenset(("dl",))),
    "tr": (frozenset(("tr", "td", "th")), _TABLE_SCOPE),
    "td": (frozenset(("td", "th")), _TABLE_SCOPE | {"tr"}),
    "th": (frozenset(("td", "th")), _TABLE_SCOPE | {"tr"}),
}
_P_CLOSE = (frozenset(("p",)), _BLOCK - {"p"})  # a block-level start tag closes an open <p>


def _is_skipped(tag: str, attrs: Sequence[tuple[str, str | None]]) -> bool:
    if tag in _SKIP or tag.endswith("info"):
        return True
    if tag in _NEVER_CHROME:
        return False
    found = {name: value or "" for name, value in attrs}
    cls, ident = found.get("class", ""), found.get("id", "")
    if found.get("role") in _CHROME_ROLES or _CHROME.search(cls):
        return True
    return (
        tag not in _ID_NAMES_CONTENT
        and not _SECTION_CLASS.search(cls)
        and bool(_CHROME.search(ident))
    )


class _BlockParser(HTMLParser):
    """Collects text blocks; ``_open`` is the stack of open elements, each with whether it is
    skipped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self._buf: list[str] = []
        self._open: list[tuple[str, bool]] = []
        self._skipping = 0  # how many open elements are skipped
        # open elements by name: a stray end tag costs no stack walk
        self._count: dict[str, int] = {}

    def _flush(self) -> None:
        text = _collapse("".join(self._buf))
        self._buf.clear()
        if text:
            self.blocks.append(text)

    def _truncate(self, index: int) -> None:
        """Close the open element at ``index`` and everything opened after it."""
        for tag, skip in self._open[index:]:
            self._skipping -= skip
            self._count[tag] -= 1
        del self._open[index:]

    def _close_implied(self, closes: frozenset[str], stops: frozenset[str]) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            tag = self._open[i][0]
            if tag in closes:
                self._truncate(i)
                return
            if tag in stops:
                return

    def _close_head(self) -> None:
        """Close an unclosed <head> (at the bottom of the stack, under <html> at most)."""
        for i, (tag, _) in enumerate(self._open[:2]):
            if tag == "head":
                self._truncate(i)
                return

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK:
            self._flush()
        if tag in _VOID:
            return
        # body content (<body> included) closes an open <head>, a block an open <p>
        if tag in _BLOCK:
            self._close_head()
            self._close_implied(*_P_CLOSE)
        if tag in _IMPLIED:
            self._close_implied(*_IMPLIED[tag])
        skip = _is_skipped(tag, attrs)
        self._open.append((tag, skip))
        self._skipping += skip
        self._count[tag] = self._count.get(tag, 0) + 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK:  # <br/>, and empty XML elements: a boundary, nothing opened
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag in _BLOCK:
            self._flush()
        if not self._count.get(tag):
            return  # no open element of that name: a stray end tag, ignored
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == tag:
                self._truncate(i)
                return

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self._buf.append(data)

    def close(self) -> None:
        super().close()
        self._flush()


def html_blocks(text: str) -> list[str]:
    """The text blocks of an HTML (or XHTML, Mallard, DocBook) document, page chrome and code left
    out."""
    parser = _BlockParser()
    parser.feed(text)
    parser.close()
    return parser.blocks


# --- roff -----------------------------------------------------------------------------------------

_GLYPHS = {
    "em": "—", "en": "–", "hy": "-", "mi": "-", "aq": "'", "dq": '"', "lq": "“", "rq": "”",
    "oq": "‘", "cq": "’", "bq": "‚", "Bq": "„", "Fo": "«", "Fc": "»", "fo": "‹", "fc": "›",
    "bu": "•", "co": "©", "rg": "®", "tm": "™", "de": "°", "dg": "†", "dd": "‡", "sc": "§",
    "ps": "¶", "ct": "¢", "Po": "£", "Ye": "¥", "Eu": "€", "eu": "€", "mu": "×", "di": "÷",
    "+-": "±", "pl": "+", "eq": "=", "<=": "≤", ">=": "≥", "!=": "≠", "==": "≡", "ap": "∼",
    "->": "→", "<-": "←", "<>": "↔", "ua": "↑", "da": "↓", "rA": "⇒", "lA": "⇐", "**": "∗",
    "ga": "`", "aa": "´", "ti": "~", "ha": "^", "sl": "/", "rs": "\\", "ul": "_", "ru": "_",
    "bv": "|", "ba": "|", "or": "|", "at": "@", "sh": "#", "Do": "$", "lB": "[", "rB": "]",
    "lC": "{", "rC": "}", "la": "⟨", "ra": "⟩", "ss": "ß", "ae": "æ", "AE": "Æ", "oe": "œ",
    "OE": "Œ", "/o": "ø", "/O": "Ø", "-D": "Ð", "Sd": "ð", "TP": "Þ", "Tp": "þ", "r!": "¡",
    "r?": "¿", "12": "½", "14": "¼", "34": "¾", "mc": "µ", "ci": "○", "sq": "□", "OK": "✓",
    "3d": "∴", "if": "∞", "*a": "α", "*b": "β", "*g": "γ", "*d": "δ", "*e": "ε", "*l": "λ",
    "*m": "μ", "*p": "π", "*s": "σ", "*W": "Ω",
}  # fmt: skip
_ACCENTS = {
    ":": "\u0308", "'": "\u0301", "`": "\u0300", "^": "\u0302", "~": "\u0303", ",": "\u0327",
    "o": "\u030a",
}  # fmt: skip
# The strings that man, mdoc and Pod::Man (the .3pm pages) define and pages use in running text.
_STRINGS = {
    "lq": "“", "rq": "”", "Aq": "'", 'L"': "“", 'R"': "”", "R": "®", "Tm": "™", "--": "—",
    "C+": "C++",
}  # fmt: skip

_ESCAPE = re.compile(
    r"""\\(?:
      [fFmM](?:\(..|\[[^\]]*\]|.)              # font, colour
    | \((?P<glyph>..)                          # \(XX
    | \[(?P<named>[^\]]*)\]                    # \[name], \[u00E9]
    | \*(?:\((?P<str2>..)|\[(?P<strn>[^\]]*)\]|(?P<str1>.))   # strings
    | s(?:[-+]?(?:\(\d\d|\[[^\]]*\]|'[^']*'?|[1-3]\d|\d))     # size
    | [nkgVY$](?:[-+]?(?:\(..|\[[^\]]*\]|.))  # registers, environment, macro arguments
    | [NhvwlLoXZxbDHSRAB]'[^']*'?              # quoted-argument escapes: drawing, motions, widths
    | (?P<char>.)
    )""",
    re.X | re.S,
)
_SINGLE = {
    "-": "-", "e": "\\", "E": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "t": " ", "'": "'",
    "`": "`",
}  # fmt: skip
_SILENT = frozenset("&c:%/,|^){}adurpz!?")


def _glyph(name: str) -> str:
    """A named roff character: ``em``, ``u00E9``, ``u0065_0301``, ``char233``, ``:a``; unknown →
    nothing."""
    if name in _GLYPHS:
        return _GLYPHS[name]
    if re.fullmatch(r"u[0-9A-Fa-f]{4,6}(?:_[0-9A-Fa-f]{4,6})*", name):
        return unicodedata.normalize("NFC", "".join(chr(int(h, 16)) for h in name[1:].split("_")))
    if re.fullmatch(r"char\d{1,7}", name):
        return chr(int(name[4:]))
    if len(name) == 2 and name[0] in _ACCENTS and name[1].isalpha():
        return unicodedata.normalize("NFC", name[1] + _ACCENTS[name[0]])
    return ""


def _unescape(s: str) -> str:
    """Roff escapes in one line of text → plain text."""

    def one(m: re.Match[str]) -> str:
        if m["glyph"] is not None or m["named"] is not None:
            return _glyph(m["glyph"] or m["named"])
        string = m["str2"] or m["strn"] or m["str1"]
        if string is not None:
            return _STRINGS.get(string, "")
        c = m["char"]
        if c is None or c in _SILENT:
            return ""
        return _SINGLE.get(c, c)

    return _ESCAPE.sub(one, s)


def _strip_comment(line: str) -> str:
    """The line up to an unescaped ``\\"`` or ``\\#`` comment."""
    i = line.find("\\")
    while i != -1 and i + 1 < len(line):
        if line[i + 1] in '"#':
            return line[:i]
        i = line.find("\\", i + 2)
    return line


def _logical_lines(text: str) -> list[str]:
    """Input lines with comments removed and ``\\``-newline continuations joined."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = pending + _strip_comment(raw)
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending = line[:-1]
            continue
        pending = ""
        out.append(line)
    if pending:
        out.append(pending)
    return out


def _roff_args(s: str) -> list[str]:
    """A request's arguments: split on spaces, ``"double quoted"`` ones kept whole (``""`` is a
    quote)."""
    args: list[str] = []
    i, n = 0, len(s)
    while i < n:
        while i < n and s[i] in " \t":
            i += 1
        if i >= n:
            break
        quoted = s[i] == '"'
        i += quoted
        buf: list[str] = []
        while i < n:
            c = s[i]
            if c == "\\" and i + 1 < n:
                buf.append(s[i : i + 2])
                i += 2
                continue
            if quoted and c == '"':
                if s[i + 1 : i + 2] == '"':
                    buf.append('"')
                    i += 2
                    continue
                i += 1
                break
            if not quoted and c in " \t":
                break
            buf.append(c)
            i += 1
        args.append("".join(buf))
    return args


_HEADINGS = frozenset(("SH", "SS", "Sh", "Ss"))
_TEXT_MACROS = frozenset(("B", "I", "SM", "SB", "Nd"))
_ALTERNATING = frozenset(("BR", "IR", "RB", "RI", "BI", "IB"))
_BREAKS = frozenset("TP TQ PP LP P IP HP sp br RS RE in ti Pp It Bl El Bd Ed".split())
_LITERAL_END = {"nf": "fi", "EX": "EE"}
_BULLETS = frozenset(("•", "—", "–", "-", "*", "o", "·", "+", ""))


class _Paragraphs:
    """Text pieces gathered into paragraphs: lines join with a line break (collapsed later), ``\\c``
    glues."""

    def __init__(self) -> None:
        self.blocks: list[str] = []
        self._parts: list[str] = []
        self._glue = False

    def add(self, text: str, glue_next: bool = False) -> None:
        if self._parts and not self._glue:
            self._parts.append("\n")
        self._parts.append(text)
        self._glue = glue_next

    def brk(self) -> None:
        text = _collapse("".join(self._parts))
        if text:
            self.blocks.append(text)
        self._parts.clear()
        self._glue = False

    def block(self, text: str) -> None:
        self.brk()
        self.add(text)
        self.brk()


def _ends_with_c(line: str) -> bool:
    """Whether the line ends with the ``\\c`` escape (the next line continues this one without a
    space)."""
    body = line.rstrip()
    if not body.endswith("c"):
        return False
    body = body[:-1]
    return (len(body) - len(body.rstrip("\\"))) % 2 == 1


def roff_blocks(text: str) -> list[str]:
    """The paragraphs and headings of a man page (man macros; mdoc tolerated), code regions left
    out."""
    out = _Paragraphs()
    # the request that ends the region being dropped (.fi, .EE, .Ed, ..)
    end_of_skip: str | None = None
    heading_next = False  # .SH without arguments: the next text line is the heading
    for line in _logical_lines(text):
        request = re.match(r"[.'][ \t]*(\S*)[ \t]*(.*)", line)
        name, rest = (request[1], request[2]) if request else ("", "")
        # a heading also ends an unclosed literal region (not a .de body)
        if end_of_skip is not None:
            if request and (name == end_of_skip or (name in _HEADINGS and end_of_skip != ".")):
                end_of_skip = None
            if end_of_skip is not None or name not in _HEADINGS:
                continue
        if not request:
            if not line.strip():
                out.brk()
            elif heading_next:
                out.block(_unescape(line))
                heading_next = False
            else:
                out.add(_unescape(line), glue_next=_ends_with_c(line))
            continue
        args = _roff_args(rest)
        glue = _ends_with_c(line)
        if name in _HEADINGS:
            heading = " ".join(_unescape(a) for a in args).strip()
            if heading:
                out.block(heading)
            else:
                out.brk()
            heading_next = not heading
        elif name in _TEXT_MACROS:
            if args:
                out.add(" ".join(_unescape(a) for a in args), glue_next=glue)
        elif name in _ALTERNATING:
            if args:
                out.add("".join(_unescape(a) for a in args), glue_next=glue)
        elif name in _LITERAL_END:
            out.brk()
            end_of_skip = _LITERAL_END[name]
        elif name == "Bd" and args and args[0] in ("-literal", "-unfilled", "-code"):
            out.brk()
            end_of_skip = "Ed"
        elif name in ("de", "de1", "am", "ig"):
            end_of_skip = "."
        elif name in _BREAKS:
            out.brk()
            tag = _unescape(args[0]).strip() if name == "IP" and args else ""
            if tag not in _BULLETS:
                out.add(tag)
    out.brk()
    return out.blocks


# --- plain text, reStructuredText -----------------------------------------------------------------

_RST_DIRECTIVE = re.compile(r"\.\.\s+([A-Za-z][\w:.+-]*?)::")
_RST_CODE = frozenset(
    (
        "code code-block sourcecode literalinclude highlight math raw parsed-literal graphviz "
        "digraph"
    ).split()
)
_RST_OPTION = re.compile(r":[^:\s][^:]*:(?:\s|$)")


def _is_rule(line: str) -> bool:
    """A line made only of punctuation and symbols (rst under/overlines, ASCII table borders)."""
    return all(c.isspace() or unicodedata.category(c)[0] in "PS" for c in line)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def text_blocks(text: str) -> list[str]:
    """The paragraphs of a plain-text or reStructuredText file."""
    blocks: list[str] = []
    para: list[str] = []
    body_of: int | None = None  # indent of the line whose deeper-indented body is dropped
    options_of: int | None = None  # indent of the directive whose ":option:" lines are dropped

    def flush() -> None:
        text = _collapse("\n".join(para))
        para.clear()
        if text:
            blocks.append(text)

    for raw in text.expandtabs().splitlines():
        line = raw.strip()
        indent = _indent(raw)
        if body_of is not None and (not line or indent > body_of):
            continue
        body_of = None
        if options_of is not None and indent > options_of and _RST_OPTION.match(line):
            continue
        options_of = None
        if not line or _is_rule(line):
            flush()
        elif line == ".." or line.startswith(".. "):
            flush()
            directive = _RST_DIRECTIVE.match(line)
            if directive is None or directive[1] in _RST_CODE:  # a comment, or code: drop the body
                body_of = indent
            else:
                options_of = indent
        # "Example::" → "Example:", "Example ::" → "Example"; literal block next
        elif line.endswith("::"):
            head = line[:-2]
            if head.strip():
                para.append(head.rstrip() if head.endswith(" ") else head + ":")
            flush()
            body_of = indent
        else:
            para.append(line)
    flush()
    return blocks


# --- files ----------------------------------------------------------------------------------------

_HTML_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)
_XML_ENCODING = re.compile(rb"""<\?xml[^>]*?encoding\s*=\s*["']([A-Za-z0-9_.:-]+)""", re.I)
_ROFF_CODING = re.compile(rb"""^[.']\\".*?-\*-.*?coding:\s*([A-Za-z0-9_.:-]+)""")


def _declared_charset(data: bytes) -> str | None:
    """The encoding a file names: an HTML meta charset, an XML declaration, an Emacs coding line of
    roff."""
    head = data[:8192]
    found = _HTML_CHARSET.search(head) or _XML_ENCODING.search(head)
    if found is None:
        for line in head.splitlines()[:2]:
            found = _ROFF_CODING.match(line)
            if found:
                break
    if found is None:
        return None
    try:
        return codecs.lookup(found[1].decode("ascii")).name
    except LookupError:
        return None


def read_text(path: Path) -> str:
    """A file's text: gunzipped when its name ends in ``.gz``; UTF-8 when it decodes as such, else
    the encoding it declares (HTML/XML/roff coding line), else latin-1."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PolyspecError(f"cannot read {path}: {e.strerror or e}") from e
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise PolyspecError(f"{path} is not a readable gzip file: {e}") from e
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode(_declared_charset(data) or "latin-1", errors="replace")


_MAN_SECTION = re.compile(r"\.[0-9][A-Za-z]*")  # ls.1, apt.conf.5, Foo::Bar.3pm, x.8x
_SUFFIXES = {
    # .page: Mallard
    ".html": "html", ".htm": "html", ".xhtml": "html", ".page": "html", ".xml": "html",
    ".txt": "text", ".rst": "text",
}  # fmt: skip


def guess_format(path: Path) -> str | None:
    """The format ``blocks(path, "auto")`` reads a file as, from its name (``.gz`` aside); None if
    unknown."""
    name = Path(path).name
    if name.endswith(".gz"):
        name = name[: -len(".gz")]
    suffix = Path(name).suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    if _MAN_SECTION.fullmatch(suffix):
        return "roff"
    return None


def blocks(path: Path, fmt: str = "auto") -> list[str]:
    """The text blocks of a file read as ``fmt`` (html, roff, text, or auto: by the file's name)."""
    if fmt == "auto":
        guessed = guess_format(path)
        if guessed is None:
            choices = ", ".join(FORMATS)
            raise PolyspecError(
                f"cannot tell the format of {path} from its name; give one of {choices}"
            )
        fmt = guessed
    extract = {"html": html_blocks, "roff": roff_blocks, "text": text_blocks}.get(fmt)
    if extract is None:
        raise PolyspecError(
            f"unknown text format {fmt!r}; expected one of {', '.join(FORMATS)} or auto"
        )
    return extract(read_text(path))
