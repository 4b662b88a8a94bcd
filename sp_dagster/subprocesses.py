"""Child processes that never outlive their parent (the ground floor: embedded servers, nodes and the Dagster UI use it)."""

import signal


def die_with_parent() -> None:
    """In the child, before exec: on Linux, ask for SIGTERM when the parent process dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
