"""mkdocs hooks for the API reference pages.

* Sphinx roles in docstrings (``:func:`plan```, ``:mod:`pipeloom.sim```) become cross-reference links
  (mkdocstrings renders Markdown, where a role would show as ``:func:plan``); a name that is not a full
  path of a documented object stays code, without a link and without a warning.
* Docstring defects that are known and reported are shown as INFO instead of failing ``--strict``: each
  entry is one warning message fragment naming the file and line; fix the docstring in ``src/`` and delete
  its entry. Anything not listed still fails the strict build.
"""
from __future__ import annotations

import html
import logging
import re

_ROLE = re.compile(r":(?:class|func|mod|meth|attr|data|exc|obj):<code>(~?)([\w.]+)(\(\))?</code>")

#: docstring warnings let through one by one (each names its file and why); empty now
KNOWN_DOCSTRING_DEFECTS: tuple[str, ...] = ()


class _Known(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and any(k in record.getMessage() for k in KNOWN_DOCSTRING_DEFECTS):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def on_startup(**kwargs) -> None:
    logging.getLogger("mkdocs.plugins.mkdocs_autorefs._internal.plugin").addFilter(_Known())


def _role_link(m: re.Match) -> str:
    tilde, name, call = m.group(1), m.group(2), m.group(3) or ""
    shown = name.rsplit(".", 1)[-1] if tilde else name  # Sphinx: ~a.b.c shows c
    return f'<autoref identifier="{html.escape(name)}" optional><code>{html.escape(shown)}{call}</code></autoref>'



def on_page_content(html_text: str, page, **kwargs) -> str:
    if not page.file.src_uri.startswith("api/"):
        return html_text
    return _ROLE.sub(_role_link, html_text)
