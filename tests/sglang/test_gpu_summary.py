"""The recorded real-SGLang GPU runs, read through the notebooks' summary tables (each fix's own
``gpu_tables`` is tested with its fix)."""


def test_without_tables_the_recorded_run_shows_its_tidy_rows(capsys):
    from sglab.sglang import compare as new

    # nothing returned: a notebook cell ending in the call would echo the run's raw repr
    assert new.show_recorded("swa_loc") is None
    out = capsys.readouterr().out
    assert "Real SGLang on a GPU, recorded:" in out and "rows" in out
    assert new.recorded("swa_loc") is not None
    assert new.show_recorded("no_such_fix") is None
    assert "not recorded yet" in capsys.readouterr().out
