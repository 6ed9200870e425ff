"""The flags a release's parsers accept, as :mod:`sglab.sglang.engine` reads them from its source,
against the release's own parser: argparse's ``--no-X`` of an argument declared with
``action=argparse.BooleanOptionalAction`` is accepted, and only for those."""

from __future__ import annotations

import pytest

from sglab.capture_sizes import sglang as cs
from sglab.sglang import engine as eng
from tests.sglang_answers import package
from sglab.sglang.engine.release import check_flags
from sglab.sglang.releases import package_dir, release_installed


pytestmark = pytest.mark.long(25)

# 0.5.11 declares its flags with add_argument in srt/server_args.py, 0.5.23 as annotated fields
# under srt/arg_groups/
RELEASES = ("0.5.11", "0.5.23")


def _flags(v: str) -> set[str]:
    return eng.release_flags(package(v), "engine")


def _no_forms() -> tuple[dict, list]:
    """``({release: the --no-X its source declares}, every one of them, sorted)``."""
    declared = {
        v: {f
            for f in eng.release_flags(package_dir(v), "engine") if f.startswith("--no-")}
        for v in RELEASES if release_installed(v)
    }
    return declared, sorted(set().union(*declared.values()))


def _parse_each(asked: list) -> dict:
    return {f: ["--tp", "2", f] for f in asked}


# the releases' parsers answer in the session's one pass (and its cache) rather than live here
REAL_CALLS = [cs.probe_call(_parse_each(_no_forms()[1]), RELEASES)] if all(
    release_installed(v) for v in RELEASES) else []


def test_the_no_form_of_a_boolean_optional_flag_is_accepted_and_of_a_plain_switch_is_not():
    f11, f23 = _flags("0.5.11"), _flags("0.5.23")
    for flags, release in ((f11, "0.5.11"), (f23, "0.5.23")):
        check_flags(["--tp-size", "2", "--no-lora-strict-loading"], flags, release, "engine")
        with pytest.raises(eng.EngineError, match=r"does not accept --no-enable-dp-attention "):
            check_flags(["--no-enable-dp-attention"], flags, release, "engine")
    assert "--no-record-nolora-graph" in f11 and "--no-enable-tf32-matmul" in f23
    assert "--enable-fp32-lm-head" in f23 and "--no-enable-fp32-lm-head" not in f23  # store_true


def test_the_no_forms_of_a_source_are_argparses(tmp_path):
    """Each ``--X`` of a BooleanOptionalAction argument, its aliases too, gets ``--no-X``; other
    actions none."""
    package = tmp_path / "9.9.9" / "sglang"
    (package / "srt" / "arg_groups").mkdir(parents=True)
    (package / "srt" / "server_args.py").write_text(
        "import argparse\nfrom argparse import BooleanOptionalAction\np.add_argument('--one', "
        "'-o', action=argparse.BooleanOptionalAction)\np.add_argument('--two', "
        "action=BooleanOptionalAction, default=True)\np.add_argument('--three', "
        "action='store_true')\n")
    (package / "srt" / "arg_groups" / "fields.py").write_text(
        "class Fields:\n    four: A[bool, Arg(help='x', "
        "action=argparse.BooleanOptionalAction,\n                      aliases=['--four-alias'])] "
        "= False\n    five: A[bool, Arg(help='x', cli_name='--fifth',\n                      "
        "action=argparse.BooleanOptionalAction)] = False\n    six: A[bool, 'a switch'] = False\n")
    assert eng.release_flags(package, "engine") == {
        "--one", "--no-one", "--two", "--no-two", "--three", "--four", "--no-four", "--four-alias",
        "--no-four-alias", "--fifth", "--no-fifth", "--six"
    }


def test_every_no_form_read_from_a_source_is_one_its_release_parses():
    """Each release's own parser (``ServerArgs.add_cli_args``) is given every ``--no-X`` either
    release's source declares: it parses exactly those its own source declares."""
    for v in RELEASES:
        package(v)
    declared, asked = _no_forms()
    assert len(declared["0.5.11"]) >= 2 and len(declared["0.5.23"]) >= 10
    rows = cs.ask(_parse_each(asked), RELEASES)
    for v in RELEASES:
        errors = rows[(rows.release == v) & (rows.metric == "error")]
        refused = {c for c, e in zip(errors.case, errors.value) if "unrecognized arguments" in e}
        assert not {"not-run", "probe-error"} & set(rows[rows.release == v].metric)
        assert refused == set(asked) - declared[v], v
