"""`DataError`: one clear message for bad input data, raised before training starts."""


class DataError(ValueError):
    """The corpus, a tokenizer file or the cache cannot be used as given; the message says
    which file (and line) and what to do."""
