"""The workbook's tools: the command line, notebooks headless, the report, JupyterLab, verify."""

import sys

# nbformat imports jsonschema, whose optional IRI format check (`rfc3987_syntax`, pulled in by
# jupyter-events' `jsonschema[format-nongpl]`) compiles 39 grammars at import: 1.1 s on an idle
# two-core box, 3 s under load, in every process that reads a notebook. No notebook schema uses an
# IRI format, and jsonschema skips the check when the module is missing, so these processes go
# without it (a process that imported it already keeps it).
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
