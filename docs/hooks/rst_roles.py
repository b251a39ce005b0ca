"""mkdocs hook: the docstrings are reStructuredText-flavoured prose (``:func:`name``` roles), which the
API reference renders as Markdown; drop the role markers so ``:func:`name``` shows as ``name`` in code."""

import re

_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|data|meth|attr|exc|obj|const|ref):(<code>)~?")


def on_page_content(html, page, config, files):
    if not page.file.src_uri.startswith("api/"):
        return html
    return _ROLE.sub(r"\1", html)
