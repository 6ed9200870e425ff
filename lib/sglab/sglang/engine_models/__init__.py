"""Model classes the engine harness registers into a release through
``SGLANG_EXTERNAL_MODEL_PACKAGE``: SGLang imports each module and reads its ``EntryClass``, which
replaces the released class of that name. Imported only inside an engine process."""
