"""The `sglab` command itself: its help answers at once, without the numeric stack that the
commands load when they run."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglab.tools import cli
from tests import as_a_terminal_starts_it


HEAVY = ("torch", "pandas", "matplotlib")
ASK = """
import sys
from sglab.tools import cli
try:
    cli.main(sys.argv[1:])
except SystemExit:
    pass
print(",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
"""


def _commands() -> list[str]:
    sub = argparse.ArgumentParser().add_subparsers()
    cli._commands(sub)
    return list(sub.choices)


def _loaded(*argv: str) -> tuple[str, str]:
    """(stdout, the heavy modules imported) of ``sglab ARGV`` in a fresh interpreter."""
    p = subprocess.run([sys.executable, "-c", ASK.format(heavy=HEAVY), *argv], capture_output=True,
                       text=True, timeout=120)
    return p.stdout, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""


def test_help_of_sglab_and_of_every_command_loads_no_numeric_stack():
    commands = _commands()
    assert {"engine", "verify", "capture-sizes", "workspace"} <= set(commands)
    out, heavy = _loaded("--help")
    assert all(c in out for c in commands) and heavy == ""
    # the opening line groups every command, in plain words (no reST markup)
    assert cli.DESCRIPTION in " ".join(out.split()) and "``" not in out
    assert all(re.search(rf"[ (]{c}[,)]", cli.DESCRIPTION) for c in commands)
    for c in commands:
        out, heavy = _loaded(c, "--help")
        assert out.startswith("usage: "), (c, out)
        assert heavy == "", f"`sglab {c} --help` imported {heavy}"


def test_every_command_says_what_it_does_and_what_each_argument_means():
    sub = argparse.ArgumentParser().add_subparsers()
    cli._commands(sub)
    bare = [
        f"{name} {a.option_strings[0] if a.option_strings else a.dest}"
        for name, p in sub.choices.items()
        for a in p._actions if not a.help and not isinstance(a, argparse._HelpAction)
    ]
    assert bare == [], f"arguments without help: {bare}"
    out, _ = _loaded("env", "--help")
    assert "describe this machine" in out  # the command's own line, under its usage


def test_the_module_names_every_command_and_says_what_sync_and_run_take(capsys):
    """The module's text names each command; `sync` pairs both ways (the edited half is taken),
    and `run` takes notebook files of your own besides names and prefixes."""
    text = " ".join(cli.__doc__.split())
    assert all(f"``{c}``" in text for c in _commands()), text
    assert "writes each" not in text and "edited half taken" in text
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "notebook files of your own" in " ".join(capsys.readouterr().out.split())


def test_the_check_sees_a_heavy_import():
    """The probe above is not blind: a command that does run imports what it needs."""
    config = Path(__file__).resolve().parents[1] / "data" / "configs" / "gemma3_text.json"
    _, heavy = _loaded("swa-cost", str(config))
    assert "pandas" in heavy.split(",")


def test_the_workbooks_processes_read_notebooks_without_jsonschemas_iri_grammars():
    """sglab.tools keeps jsonschema's optional IRI check out (its 39 grammars cost 1-3 s per
    process); notebooks still read and validate."""
    code = ("import sys, sglab.tools, nbformat; nb = nbformat.read(sys.argv[1], as_version=4); "
            "nbformat.validate(nb); print(len(nb.cells), sys.modules['rfc3987_syntax'])")
    nb = Path(__file__).resolve().parents[2] / "notebooks" / "00_start_here.ipynb"
    p = subprocess.run([sys.executable, "-c", code, str(nb)], capture_output=True, text=True,
                       timeout=120)
    cells, loaded = p.stdout.split()
    assert p.returncode == 0 and int(cells) > 5 and loaded == "None", p.stderr[-500:]


RECORDED = Path(__file__).resolve().parents[2] / "data" / "recorded"


def _copy_run(csv: Path, folder: Path) -> Path:
    """``csv``, its manifest and its sidecars copied into ``folder``; the copy's CSV."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    for f in csv.parent.glob(csv.stem + ".*"):
        shutil.copy2(f, folder / f.name)
    return folder / csv.name


def _damaged(csv: Path, folder: Path, old: str, new: str) -> Path:
    copy = _copy_run(csv, folder)
    text = copy.read_text()
    assert old in text
    copy.write_text(text.replace(old, new))
    return copy


@pytest.mark.parametrize("experiment, old, new", [
    ("swa_loc", ",translate_calls_capture,5.0,", ",translate_calls_capture,0.0,"),
    ("engine_swa_loc", ",decode_kernels_per_replay,148,", ",decode_kernels_per_replay,140,"),
])
def test_publish_never_replaces_a_record_nor_publishes_failing_claims_without_force(
        data_root, tmp_path, capsys, experiment, old, new):
    """A run whose claims fail is refused, and so is a run whose name the record already holds
    (its own copy included): one line each, exit 2, the record untouched; --force does both."""
    src = next(p for p in sorted((RECORDED / experiment).glob("*.csv")) if old in p.read_text())
    recorded = _copy_run(src, data_root / "recorded" / experiment)
    before = recorded.read_bytes()
    damaged = _damaged(src, tmp_path / "elsewhere", old, new)
    assert cli.main(["verify", str(damaged)]) == 1
    capsys.readouterr()

    assert cli.main(["publish", str(damaged)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "claim(s) fail" in err and "--force" in err, err
    assert recorded.read_bytes() == before

    whole = _copy_run(src, tmp_path / "whole")
    assert cli.main(["publish", str(whole)]) == 2
    err = capsys.readouterr().err
    assert err == f"sglab publish: {recorded} is already recorded; --force replaces it\n"
    assert recorded.read_bytes() == before
    assert cli.main(["publish", str(recorded)]) == 2
    assert "nothing to publish" in capsys.readouterr().err

    assert cli.main(["publish", str(damaged), "--force"]) == 0
    assert recorded.read_bytes() == damaged.read_bytes() != before


def test_publish_suggests_a_verify_command_that_a_shell_reads_back(data_root, tmp_path, capsys):
    import shlex

    src = next(p for p in sorted((RECORDED / "swa_loc").glob("*.csv"))
               if ",translate_calls_capture,5.0," in p.read_text())
    damaged = _damaged(src, tmp_path / "my runs", ",translate_calls_capture,5.0,",
                       ",translate_calls_capture,0.0,")
    assert cli.main(["publish", str(damaged)]) == 2
    said = re.search(r"`(sglab verify [^`]*)` says why", capsys.readouterr().err).group(1)
    assert shlex.split(said) == ["sglab", "verify", str(damaged)]


def test_a_folder_given_as_a_run_or_a_missing_notebook_file_is_named(tmp_path, capsys):
    for argv, says in ((["verify", str(tmp_path)], f"sglab verify: {tmp_path} is a folder: name a "
                        "run's .csv file (its .json manifest beside it)\n"), ([
                            "run", str(tmp_path / "mine.ipynb")
                        ], f"sglab run: {tmp_path / 'mine.ipynb'}: no such file\n"), ([
                            "run", str(tmp_path / "04_swa_loc.ipynb")
                        ], f"sglab run: {tmp_path / '04_swa_loc.ipynb'}: no such file\n")):
        assert cli.main(argv) == 2
        assert capsys.readouterr() == ("", says)


def test_publish_copies_a_new_run_whose_claims_hold(data_root, tmp_path, capsys):
    src = sorted((RECORDED / "swa_loc").glob("*.csv"))[0]
    live = _copy_run(src, data_root / "runs" / "swa_loc")
    assert cli.main(["publish", str(live)]) == 0
    assert (data_root / "recorded" / "swa_loc" / src.name).read_bytes() == src.read_bytes()
    assert "published" in capsys.readouterr().out


ROOT = Path(__file__).resolve().parents[2]


def _into_gone_head(*argv: str, env=None) -> subprocess.CompletedProcess:
    """``sglab ARGV | head -1`` once head has printed its line and left: every line sglab writes
    meets a pipe without a reader, whatever the timing of the two processes."""
    r, w = os.pipe()
    head = subprocess.Popen(["head", "-1"], stdin=r, stdout=subprocess.DEVNULL)
    os.close(r)
    os.write(w, b"a first line\n")
    assert head.wait(timeout=30) == 0
    try:
        return subprocess.run([str(Path(sys.executable).parent / "sglab"), *argv], stdout=w,
                              stderr=subprocess.PIPE, text=True, timeout=300, cwd=ROOT,
                              env={**os.environ, **(env or {})})
    finally:
        os.close(w)


@pytest.mark.parametrize("argv", [
    ("workspace", "--trace", "data/examples/sglang_server_short_prompts.log", "--world-size", "4"),
    ("swa-cost", "tests/data/configs/gemma3_text.json"),
    ("verify", "--all"),
    ("upstream", "--releases", "--offline", "--no-write"),
    ("capture-sizes", "--release", "0.5.11", "--", "--tp", "2"),
])
def test_output_into_a_head_that_has_gone_ends_quietly(argv):
    """As Unix tools do: no traceback, the status of a process ended by SIGPIPE (141). The release's
    table comes from the recording and the releases' from the cache or the committed table (the
    pipe, not the release or the network, is under test here; a live answer is printed the same
    way)."""
    p = _into_gone_head(*argv, env={"SGLAB_REAL": "recorded"})
    assert (p.returncode, p.stderr) == (141, ""), p.stderr[-2000:]


def test_a_long_output_piped_into_head_ends_quietly():
    p = subprocess.run(f"{Path(sys.executable).parent / 'sglab'} verify --all | head -1",
                       shell=True, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.stdout.startswith("== ") and p.stdout.count("\n") == 1
    assert p.stderr == ""


@pytest.mark.parametrize("argv, says", [
    (["run", "00", "--cell-timeout", "-5"], "sglab run: --cell-timeout -5: must be more than 0"),
    (["run", "00", "--cell-timeout", "0"], "sglab run: --cell-timeout 0: must be more than 0"),
    (["capture-sizes", "--gpu-mem-gb", "-5", "--", "--tp", "2"
      ], "sglab capture-sizes: --gpu-mem-gb -5: must be more than 0"),
    (["capture-sizes", "--gpu-mem-gb", "nan", "--", "--tp", "2"
      ], "sglab capture-sizes: --gpu-mem-gb nan: must be a finite number"),
])
def test_a_number_that_must_be_positive_is_refused_in_one_line_before_anything_runs(
        monkeypatch, capsys, argv, says):
    from sglab.capture_sizes import sglang as cs_sglang
    from sglab.tools import report

    monkeypatch.setattr(report, "run_notebooks", lambda *a, **k: pytest.fail("a notebook ran"))
    monkeypatch.setattr(cs_sglang, "run_probes", lambda *a, **k: pytest.fail("a release started"))
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", says + "\n")


@pytest.mark.parametrize("flag, values", [("--batch-size", ["4", "-1"]),
                                          ("--input-len", ["128", "0"]), ("--output-len", ["-1"]),
                                          ("--requests", ["0"]), ("--repeats", ["0"]),
                                          ("--prompts", ["0"]), ("--timeout", ["0"])])
def test_every_engine_count_length_and_timeout_not_above_0_is_refused_in_one_line(
        capsys, flag, values):
    """Each value of a list flag too, for a single run as for a plan (--dry-run: nothing would
    start anyway, so only the check stands between the value and the printed commands)."""
    model = str(ROOT / "data" / "models" / "llama_32x512")
    for how in (["--release", "0.5.13", "--model", model], ["--plan", "03"]):
        assert cli.main(["engine", *how, "--dry-run", flag, *values]) == 2
        out = capsys.readouterr()
        assert (out.out, out.err) == ("",
                                      f"sglab engine: {flag} {values[-1]}: must be more than 0\n")


def test_verify_against_an_unknown_reference_names_it(capsys):
    for argv in (["verify", "--against", "NOEXP"], ["verify", "swa_loc", "--against", "NOEXP"]):
        assert cli.main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1
        assert err.startswith("sglab verify: --against NOEXP: no such experiment or run file; "
                              "experiments: pcg_gate, ")


def test_verify_junit_into_a_folder_is_refused_before_anything_is_verified(
        tmp_path, capsys, monkeypatch):
    from sglab.tools import verify

    monkeypatch.setattr(verify, "verify_run", lambda *a, **k: pytest.fail("a run was verified"))
    assert cli.main(["verify", "swa_loc", "--junit", str(tmp_path)]) == 2
    assert capsys.readouterr() == ("", f"sglab verify: --junit {tmp_path}: is a folder (name the "
                                   f"file to write, e.g. {tmp_path / 'verify.xml'})\n")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_ends_a_command_in_one_line_with_130():
    """Ctrl-C (SIGINT to the terminal's process group) once the command is under way, and again
    while it exits (its interpreter takes a few hundred ms to wind down): no traceback, the status
    of a process ended by SIGINT. Without the second one ignored, the second Ctrl-C ended the
    process by SIGINT itself (-2) or printed a KeyboardInterrupt from an exit handler."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "sglab.tools.cli", "verify", "--all"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=as_a_terminal_starts_it,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "lib")})
    assert p.stdout.readline().startswith("== ")  # the first run verified, about 100 to go
    os.killpg(p.pid, signal.SIGINT)
    try:
        p.wait(timeout=0.1)
    except subprocess.TimeoutExpired:  # not reaped: its group is still its own
        os.killpg(p.pid, signal.SIGINT)  # pressed twice
    _, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (130, "sglab verify: stopped by SIGINT\n")


@pytest.mark.parametrize("argv, where", [(["index", "--check"], "sglab.tools.readme.stale"),
                                         (["sync"], "sglab.tools.nbtools.pairs")])
def test_ctrl_c_is_one_line_in_every_command(monkeypatch, capsys, argv, where):

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(where, interrupted)
    assert cli.main(argv) == 130
    assert capsys.readouterr() == ("", f"sglab {argv[0]}: stopped by SIGINT\n")


def test_index_names_a_missing_marker_and_its_file_in_one_line(tmp_path, monkeypatch, capsys):
    from sglab.core import runs

    for doc in ("README.md", "docs/structure.md", "docs/operating.md"):
        (tmp_path / doc).parent.mkdir(exist_ok=True)
        (tmp_path / doc).write_text((ROOT / doc).read_text().replace("<!-- house:end -->", ""))
    monkeypatch.setattr(runs, "repo_root", lambda: tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.md")}
    for argv in (["index", "--check"], ["index"]):
        assert cli.main(argv) == 2
        assert capsys.readouterr() == ("",
                                       "sglab index: docs/structure.md has no <!-- house:end --> "
                                       "marker: put it back where its generated block ends (`sglab "
                                       "index` writes between <!-- house:start --> and <!-- "
                                       "house:end -->)\n")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.md")} == before


@pytest.mark.parametrize("param, says", [
    ("world_size=abc", "--param world_size='abc': workspace_floor's world_size must be an integer "
     "(default 2)"),
    ("world_size=True",
     "--param world_size=True: workspace_floor's world_size must be an integer "),
    ("profile=1", "--param profile=1: workspace_floor's profile must be True or False (default "),
])
def test_record_names_a_parameter_of_the_wrong_type_and_the_type_it_takes(
        monkeypatch, capsys, param, says):
    from sglab.core import runs

    monkeypatch.setattr(runs, "measure", lambda *a, **k: pytest.fail("a measurement ran"))
    assert cli.main(["record", "workspace_floor", "--param", param]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"sglab record: {says}") and err.count("\n") == 1


@pytest.mark.parametrize("argv, says", [
    (["real"], "sglab real: no action: one of install (the pinned releases side by side), record "),
    (["real", "install", "--releases", "9.9"
      ], "sglab real install: not a release version: '9.9' (expected e.g. 0.5.12 or 0.5.12.post1)"),
])
def test_real_without_an_action_or_with_a_bad_release_is_one_line(capsys, argv, says):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(says) and err.count("\n") == 1


def test_version_is_the_packages():
    import importlib.metadata as md

    p = subprocess.run([str(Path(sys.executable).parent / "sglab"), "--version"],
                       capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout, p.stderr) == (0, f"sglab {md.version('sglab')}\n", "")


def test_an_unknown_argument_is_one_line_naming_the_command(capsys):
    from sglab.tools import cli

    assert cli.main(["verify", "--all", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("sglab verify: unrecognized argument(s) --bogus (sglab verify --help "
                           "lists its arguments)")


@pytest.mark.parametrize("argv, said", [
    (["engine", "--batch-size", "4,8"], "argument --batch-size: invalid int value: '4,8'"),
    (["real", "bogus"], "argument action: invalid choice: 'bogus'"),
])
def test_a_value_argparse_refuses_is_one_line_naming_the_command(argv, said, capsys):
    """A value of the wrong type or choice: one line naming the command and its --help, not the
    command's whole usage (a path of your own of the workbook's name is still that path)."""
    from sglab.tools import cli

    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"sglab {argv[0]}: {said}")
    assert err.endswith(f"(sglab {argv[0]} --help lists its arguments)\n")
