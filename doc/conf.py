"""Sphinx configuration for the geon user guide.

Build with ``python -m sphinx -b html doc doc/_build/html``. The code samples are run by
``tests/test_docs.py``, which does not need Sphinx.
"""

project = "geon"
author = "the geon authors"
copyright = "the geon authors; Apache License 2.0"
release = version = "0.1.0"

import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the checkout's geon, not an installed one
sys.path.insert(0, os.path.abspath("_ext"))

# geon_figures (doc/_ext): the pictures, made from geon when the guide is built.
extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon",
              "geon_figures"]
napoleon_numpy_docstring = False  # our docstrings use the Google style ("Args:")
# The API pages (doc/api/) list their names by hand; tests/test_api_docs.py checks them
# against ``__all__``. Nothing is generated into the source tree.
autosummary_generate = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Defaults as written in the source (``dtype=np.float32``, not "<class ...>", which
# would also spoil the signature's type links)
autodoc_preserve_defaults = True
nitpicky = True
# Types from outside geon that signatures name; without intersphinx (the build must
# work offline) they cannot be linked.
nitpick_ignore = [("py:class", "numpy.ndarray"), ("py:class", "numpy.dtype"),
                  ("py:class", "numpy.generic"), ("py:class", "os.PathLike"),
                  ("py:class", "types.SimpleNamespace"),
                  # the optional frontends' types (onnx, torch are not imported here)
                  ("py:class", "onnx.ModelProto"), ("py:class", "torch.nn.Module"),
                  # make_progress's tqdm-drawn bar: not exported, described there
                  ("py:class", "geon.frontends.neon.progress.TqdmProgress")]
root_doc = "index"
exclude_patterns = ["_build"]
highlight_language = "python"
pygments_style = "sphinx"
html_theme = "alabaster"
# A page wide enough for the samples' lines beside a sidebar that shows full module
# names (geon.transformers.passes), and still narrower than a 1,200 px window; below
# page_width, alabaster moves the sidebar under the page.
html_theme_options = {"page_width": "1160px", "sidebar_width": "270px"}
# _static/geon.css: code blocks wrap instead of scrolling sideways; long names in the
# sidebar wrap (tests/test_docs.py checks both are wired here).
html_static_path = ["_static"]
html_css_files = ["geon.css"]
