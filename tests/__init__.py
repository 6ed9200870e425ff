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
