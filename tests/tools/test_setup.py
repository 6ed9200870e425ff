"""The set-up as a reader meets it: every path the scripts and the docs name is in the checkout."""

import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
# what the scripts run and the docs point at
NAMING = ("Makefile", ".ci/run", "README.md", "scripts/*.sh", "docs/*.md")
# a repository path: one of the checkout's top folders, then the rest of the path
PATH = re.compile(r"(?<![\w./-])((?:tests|scripts|lib|data|notebooks|docs|constraints|\.ci)/"
                  r"[\w./<>*{}$…-]*)")
# placeholders: `tests/<fix>/`, `data/upstream/*/`, `data/runs/$e`, `notebooks/NN_<fix>.py`
PLACEHOLDER = re.compile(r"[<>*{}$…]|NN_")
GENERATED = ("data/runs",)  # written by a run, git-ignored
ELSEWHERE = ("data/include", "data/csrc", "data/spdlog")  # FlashInfer's data folders, not ours


def _named(text: str) -> set[str]:
    """The repository paths a text names, less placeholders and trailing punctuation."""
    out = set()
    for m in PATH.finditer(text):
        p = m.group(1).rstrip(".,:;")
        if not PLACEHOLDER.search(p):
            out.add(p)
    return out


def _missing(root: Path = ROOT) -> list[str]:
    """``file: path`` for every path a script or doc names that the checkout does not have."""
    out = []
    for pattern in NAMING:
        for f in sorted(root.glob(pattern)):
            for p in sorted(_named(f.read_text(encoding="utf-8"))):
                p = p.rstrip("/")
                if p in ELSEWHERE or p.startswith(GENERATED) or (root / p).exists():
                    continue
                out.append(f"{f.relative_to(root)}: {p}")
    return out


def test_every_path_the_scripts_and_docs_name_exists():
    assert _missing() == []


def test_a_moved_path_is_found(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "tests" / "sglang").mkdir(parents=True)
    (tmp_path / "tests" / "sglang" / "test_gpu.py").write_text("")
    (tmp_path / "scripts" / "a.sh").write_text(
        "pytest -m gpu tests/test_real_gpu.py tests/sglang/test_gpu.py\n"
        "ls tests/<fix>/ data/runs/x.csv data/upstream/*/pr*.json $OUT/tests/x\n")
    assert _missing(tmp_path) == ["scripts/a.sh: tests/test_real_gpu.py"]
    assert _named("see `lib/sglab/core/kernels.py`.") == {"lib/sglab/core/kernels.py"}
