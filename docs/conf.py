"""Sphinx configuration of the oxygen_ros guides and API reference (`make docs`).

Markdown guides through MyST, the API reference from the docstrings through autodoc, the Read the
Docs theme: the same tools rosdoc2 uses for ROS 2 packages. The build runs with ``-W``: every warning
is an error.
"""

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))

project = "oxygen_ros"
author = "oxygen_ros developers"  # package.xml's maintainer
copyright = "oxygen_ros developers, Apache-2.0"
with open(os.path.join(ROOT, "package.xml"), encoding="utf-8") as f:
    release = version = re.search(r"<version>([^<]+)</version>", f.read()).group(1)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "oxygen_params",  # docs/_ext: the node's parameter tables, read from the code
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

# MyST: ::: fences for admonitions; anchors for headings so that links like robot.md#utterances work.
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

# autodoc: members in source order, the class docstring plus __init__'s, type hints in the description.
autodoc_member_order = "bysource"
# Document what a module defines, not the names it re-exports in __all__ (documented where defined).
autodoc_default_options = {"ignore-module-all": True}
autoclass_content = "both"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "sphinx_rtd_theme"
html_title = "oxygen_ros"
html_static_path = ["_static"]
html_css_files = ["wrap_tables.css"]
