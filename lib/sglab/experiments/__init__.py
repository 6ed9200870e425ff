"""One module per notebook: ``run(params) -> tidy DataFrame``, used by notebooks, the CLI and the tests."""
