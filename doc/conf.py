"""Sphinx configuration for the geon user guide.

Build with ``python -m sphinx -b html doc doc/_build/html``. The code samples are run by
``tests/test_docs.py``, which does not need Sphinx.
"""

project = "geon"
author = "the geon authors"
copyright = "the geon authors; Apache License 2.0"
release = version = "0.1.0"

extensions = []
root_doc = "index"
exclude_patterns = ["_build"]
highlight_language = "python"
pygments_style = "sphinx"
html_theme = "alabaster"
html_static_path = []
