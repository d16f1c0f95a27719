"""The typed errors of decoder-audit.

Every error names the offending value and the limit it broke, so a user can fix the input
without reading our code. All of them are `ValueError`s, so generic callers still catch them.
"""


class ConfigError(ValueError):
    """A `DecoderConfig` field (or a combination of fields) is invalid."""


class DecoderInputError(ValueError):
    """Token ids given to a decoder break its input contract."""


class ContextLengthError(DecoderInputError):
    """The sequence is empty or longer than `max_seq_len`; nothing is ever cropped."""


class TokenIdError(DecoderInputError):
    """A token id lies outside `[0, vocab_size)`."""


class InputShapeError(DecoderInputError):
    """The ids are not an integer tensor of rank 2 `(B, T)` with B >= 1."""


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not fit its config."""


class RunFolderError(ValueError):
    """A training run folder is in use by another run (its lock is held), or holds files a new
    run would overwrite."""


class TrainingDiverged(RuntimeError):
    """The loss (or the gradient norm, or the evaluation loss) became NaN or inf: the run stops
    at that step without applying it, and the last finite checkpoint is kept."""

    def __init__(self, message: str, *, step: int, quantity: str, value: float) -> None:
        super().__init__(message)
        self.step, self.quantity, self.value = step, quantity, value


class LeakageSuspected(RuntimeError):
    """A loss fell below the entropy floor of the task, which no causal model can reach: the
    model reads the targets it predicts (a leak the gate did not see, or a wrong shift). The
    run stops at that step; the figures are in the message and the attributes."""

    def __init__(self, message: str, *, step: int, loss: float, floor: float) -> None:
        super().__init__(message)
        self.step, self.loss, self.floor = step, loss, floor


class NonFiniteLogitsError(ValueError):
    """The model's next-token logits for a row hold no distribution to choose from (NaN or +inf
    at a token, or -inf at every token): a broken or diverged model, not a bad prompt, so not a
    DecoderInputError. `row` is the prompt row, `step` the new token being chosen (0: the
    first)."""

    def __init__(self, row: int, step: int, what: str) -> None:
        super().__init__(f"the model's next-token logits for prompt row {row} at step {step} "
                         f"(new token {step + 1}) {what}: there is no distribution to choose a "
                         "token from (a broken or diverged model); nothing was generated")
        self.row, self.step, self.what = row, step, what
