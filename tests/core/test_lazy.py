"""A module named for later (`sglab.core.lazy`): imported at its first use, so that reading the
fixes' records costs no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglab.core import lazy


def _loaded(code: str) -> set[str]:
    out = subprocess.run([
        sys.executable, "-c", f"import sys; {code}; print(' '.join(m for m in "
        "('torch', 'sglab.swa_loc.rebuild', 'json.tool') if m in sys.modules))"
    ], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-800:]
    return set(out.stdout.split())


def test_the_module_is_imported_at_the_first_attribute_read():
    assert _loaded("from sglab.core import lazy; m = lazy.Module('json.tool')") == set()
    assert _loaded("from sglab.core import lazy; m = lazy.Module('json.tool'); m.main") == {
        "json.tool"
    }


def test_a_stand_in_reads_through_and_refuses_writes():
    import json.tool

    m = lazy.Module("json.tool")
    assert m.main is json.tool.main and m.__name__ == "json.tool"
    assert "json.tool" in repr(m)
    with pytest.raises(AttributeError, match="on the module json.tool itself"):
        m.main = None
    with pytest.raises(ModuleNotFoundError):
        lazy.Module("sglab.no_such_module").anything


def test_reading_every_fix_record_imports_no_torch():
    """The command line, the engine's scenarios and `sglab upstream` read the records only."""
    code = ("from sglab.tools import fixes; [f.hunks for f in fixes.FIXES]; "
            "[s.specs() for s in fixes.scenarios()]; fixes.adjustments()")
    assert _loaded(code) == set()
    # a comparison that needs the rebuild imports it, and torch with it
    assert _loaded("from sglab.swa_loc import sglang; sglang.rebuild_write(True)") == {
        "torch", "sglab.swa_loc.rebuild"
    }
