"""The workbook's tools: the command line, notebooks headless, the report, JupyterLab, verify."""

import sys

# jsonschema's optional IRI format check (`rfc3987_syntax`) compiles 39 grammars at import (1-3 s in
# every process that reads a notebook); no notebook schema uses it, and jsonschema skips it when the
# module is missing.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
