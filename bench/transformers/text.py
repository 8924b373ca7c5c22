"""English prose for the KV-cache accuracy table, from Debian's documentation packages.

    apt-get install python3-doc debian-reference-en
    python3 bench/transformers/text.py --out build/kv-text

writes two plain-text files:
  eval.txt        the Python 3 manual's prose (python3-doc: tutorial, how-tos, FAQ, language
                  and library reference), paragraphs in file order
  calibrate.txt   the Debian Reference (debian-reference-en): held-out text for calibrating
                  global scales, never evaluated on
Only paragraph-like elements are kept (<p>, <li>, <dd>, <dt>, headings); code blocks (<pre>),
tables of contents, navigation and footers are dropped, whitespace is collapsed, and a
paragraph shorter than 40 characters or mostly non-letters is skipped. The same packages give
the same files: the script sorts its inputs and prints their SHA-256.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import html.parser
import os
import re
import sys
from typing import List

PYTHON_DOC = "/usr/share/doc/python3-doc/html"
DEBIAN_REFERENCE = "/usr/share/debian-reference"
# The Python manual's prose sections, in reading order; the C API and "What's New" (mostly
# lists of changes) are left out.
PYTHON_SECTIONS = ("tutorial", "howto", "faq", "reference", "library")

_KEEP = {"p", "li", "dd", "dt", "h1", "h2", "h3", "h4", "blockquote"}
_DROP = {"pre", "script", "style", "nav", "table", "head", "code"}


class _Paragraphs(html.parser.HTMLParser):
    """Collects the text of paragraph-like elements, skipping code and navigation."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs: List[str] = []
        self._drop = 0
        self._depth = 0
        self._text: List[str] = []
        self._skip_div = []  # per open div: whether it is navigation (sphinx "related", "sphinxsidebar", ...)

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "")
        if tag == "div":
            nav = any(c in classes for c in ("related", "sphinxsidebar", "footer", "navfooter", "navheader", "toc"))
            self._skip_div.append(nav)
            self._drop += nav
        elif tag in _DROP and not (tag == "code" and self._depth):
            self._drop += 1
        elif tag in _KEEP:
            if self._depth == 0:
                self._text = []
            self._depth += 1
        elif tag == "br":
            self._text.append(" ")

    def handle_endtag(self, tag):
        if tag == "div":
            if self._skip_div:
                self._drop -= self._skip_div.pop()
        elif tag in _DROP and not (tag == "code" and self._depth):
            self._drop = max(0, self._drop - 1)
        elif tag in _KEEP and self._depth:
            self._depth -= 1
            if self._depth == 0:
                self._flush()

    def handle_data(self, data):
        if self._depth and not self._drop:
            self._text.append(data)

    def _flush(self):
        text = re.sub(r"\s+", " ", "".join(self._text)).strip().replace("\u00b6", "").strip()
        letters = sum(ch.isalpha() for ch in text)
        if len(text) >= 40 and letters >= 0.6 * len(text):
            self.paragraphs.append(text)


def paragraphs_of(path: str) -> List[str]:
    parser = _Paragraphs()
    with open(path, encoding="utf-8", errors="replace") as f:
        parser.feed(f.read())
    return parser.paragraphs


def _files(root: str, patterns) -> List[str]:
    out: List[str] = []
    for pattern in patterns:
        out += sorted(glob.glob(os.path.join(root, pattern)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for eval.txt and calibrate.txt")
    ap.add_argument("--python-doc", default=PYTHON_DOC)
    ap.add_argument("--debian-reference", default=DEBIAN_REFERENCE)
    args = ap.parse_args(argv)
    sources = {
        "eval.txt": _files(args.python_doc, [s + "/*.html" for s in PYTHON_SECTIONS]),
        "calibrate.txt": _files(args.debian_reference, ["*.en.html"]),
    }
    os.makedirs(args.out, exist_ok=True)
    for name, files in sources.items():
        if not files:
            print("text.py: no HTML found for %s (install python3-doc and debian-reference-en)" % name,
                  file=sys.stderr)
            return 2
        seen = set()
        paragraphs = []
        for path in files:
            for p in paragraphs_of(path):
                if p not in seen:  # repeated boilerplate ("Changed in version ...") once
                    seen.add(p)
                    paragraphs.append(p)
        text = "\n\n".join(paragraphs) + "\n"
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(text)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        print("%s: %d files, %d paragraphs, %d characters, sha256 %s"
              % (name, len(files), len(paragraphs), len(text), digest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
