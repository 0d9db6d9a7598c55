"""``SimError``: how every part of the twin host reports a failed operation or bad input."""


class SimError(Exception):
    """A failed twin operation; ``exit_code`` 1 (operation failed) or 2 (bad input)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
