import signal


def as_a_terminal_starts_it() -> None:
    """A child's SIGINT and SIGHUP as a terminal's shell leaves them (``preexec_fn``): a suite
    started in the background or under nohup ignores them, and its children would inherit that."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
