"""Model classes the engine harness registers into a release through
``SGLANG_EXTERNAL_MODEL_PACKAGE``.

SGLang's model registry imports every module of this package and reads its ``EntryClass``; a class
named like a released one replaces it (``ModelRegistry.register(pkg, overwrite=True)``). Each module
here says which adjustment of :mod:`sglab.sglang.engine` uses it and why. Nothing here is imported
outside an engine process.
"""
