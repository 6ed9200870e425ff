import contextlib
import signal


def as_a_terminal_starts_it() -> None:
    """A child's SIGINT and SIGHUP as a terminal's shell leaves them (``preexec_fn``): a suite
    started in the background or under nohup ignores them, and its children would inherit that."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@contextlib.contextmanager
def scratch_for(module: str):
    """Inside, a GPU test module (``test_gpu``, ``test_foundation_gpu``, ...) makes its temporary
    files in a folder of its own, removed at the end, as :func:`sglab.core.runs.measure` does for a
    recorded run; any other module is left as it is."""
    if "gpu" not in module.rsplit(".", 1)[-1]:
        yield
        return
    from sglab.core import runs

    with runs._scratch():
        yield


def card_story_appendix(stem: str) -> tuple[str, str]:
    """A notebook's text (its jupytext ``notebooks/<stem>.py``) before and after its Appendix
    heading, once its first code cells are checked: the parameters, then the review card."""
    from pathlib import Path

    book = Path(__file__).resolve().parents[1] / "notebooks" / f"{stem}.py"
    cells = [c.strip() for c in book.read_text().split("# %%")[1:]]
    code = [c for c in cells if not c.startswith("[markdown]")]
    assert code[0].startswith('tags=["parameters"]')
    assert code[1].rstrip().endswith("card(sglang.FIX, claims, run, engine)")
    appendix = next(i for i, c in enumerate(cells) if c.startswith("[markdown]\n# ## Appendix"))
    return "\n".join(cells[:appendix]), "\n".join(cells[appendix:])
