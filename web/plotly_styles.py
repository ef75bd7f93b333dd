"""The inline ``<style>`` elements plotly.js creates, as Content-Security-Policy hashes.

plotly.js (served from the installed ``plotly`` package) appends style elements when it loads: an
empty one it fills through ``CSSStyleSheet.insertRule`` (which CSP does not govern) and one holding
the maplibre CSS it bundles. Their text is fixed in the bundle, so their SHA-256 hashes are read
from the very file we serve, and follow ``plotly`` upgrades. A style element with any other text
stays blocked.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import lru_cache
from pathlib import Path

import plotly

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

# `createElement("style");` followed shortly by `.textContent='...'` (or "...")
_STYLE_TEXT = re.compile(r'createElement\("style"\);[^;]{0,200}?\.textContent='
                         r'(\'(?:[^\'\\]|\\.)*\'|"(?:[^"\\]|\\.)*")')
_JS_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}


def _unescape(literal: str) -> str:
    """The value of a JavaScript string literal (quotes included)."""

    def one(m: re.Match[str]) -> str:
        esc = m.group(1)
        if esc[0] in "ux" and len(esc) > 1:
            return chr(int(esc[1:], 16))
        return _SIMPLE_ESCAPES.get(esc, esc)

    return _JS_ESCAPE.sub(one, literal[1:-1])


def csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@lru_cache(maxsize=1)
def plotly_style_hashes() -> tuple[str, ...]:
    source = PLOTLY_JS.read_text(encoding="utf-8")
    texts = {""} | {_unescape(m.group(1)) for m in _STYLE_TEXT.finditer(source)}
    return tuple(sorted(csp_hash(t) for t in texts))
