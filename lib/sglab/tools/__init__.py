"""The workbook's tools: the command line, notebooks headless, the report, JupyterLab, verify."""
