"""sglab.core.bytecode: where PYTHONDONTWRITEBYTECODE is set, a process and its children keep
bytecode in a private cache; SGLAB_PYCACHE=off leaves the interpreter alone; nothing changes where
bytecode is written normally."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


LIB = Path(__file__).resolve().parents[2] / "lib"

PARENT = """
import subprocess, sys
from sglab.core import bytecode
print(bytecode.enable())
import parentmod
subprocess.run([sys.executable, "-c", "import childmod"], check=True)
"""


@pytest.fixture
def sandbox(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "parentmod.py").write_text("X = 1\n")
    (src / "childmod.py").write_text("Y = 2\n")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPYCACHEPREFIX", "SGLAB_PYCACHE"}}
    env.update(PYTHONPATH=f"{src}{os.pathsep}{LIB}", XDG_CACHE_HOME=str(tmp_path / "cache"))
    return tmp_path, src, env


def _pycs(root: Path, stem: str) -> list[Path]:
    return sorted(root.rglob(f"{stem}.*.pyc"))


def _run(env, cwd) -> str:
    return subprocess.run([sys.executable, "-c", PARENT], env=env, cwd=cwd, capture_output=True,
                          text=True, check=True, timeout=120).stdout


def test_cache_for_process_and_children_when_bytecode_is_off(sandbox):
    tmp, src, env = sandbox
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = _run(env, tmp)
    cache = tmp / "cache" / "sglab" / "pycache"
    assert f"bytecode cache: {cache}" in out and "PYTHONDONTWRITEBYTECODE is set" in out
    assert len(_pycs(cache, "parentmod")) == 1  # this process
    assert len(_pycs(cache, "childmod")) == 1  # a child: the environment carried it
    assert not (src / "__pycache__").exists()  # the sources' folder is untouched


def test_off_leaves_the_interpreter_alone(sandbox):
    tmp, src, env = sandbox
    env.update(PYTHONDONTWRITEBYTECODE="1", SGLAB_PYCACHE="off")
    assert _run(env, tmp).strip() == "None"
    assert not _pycs(tmp, "parentmod") and not _pycs(tmp, "childmod")


def test_explicit_folder(sandbox):
    tmp, src, env = sandbox
    env.update(PYTHONDONTWRITEBYTECODE="1", SGLAB_PYCACHE=str(tmp / "mine"))
    assert f"bytecode cache: {tmp / 'mine'}" in _run(env, tmp)
    assert len(_pycs(tmp / "mine", "childmod")) == 1


def test_nothing_to_do_where_bytecode_is_written(sandbox):
    tmp, src, env = sandbox
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    assert _run(env, tmp).strip() == "None"
    assert len(_pycs(src / "__pycache__", "childmod")) == 1  # Python's own place
    assert not (tmp / "cache").exists()
