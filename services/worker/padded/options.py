"""The padded engine's `--backend` choices (its forward: ztgi's own or the `transformers` module's):
the worker's config reads these, so this module imports nothing heavy."""

BACKENDS = ("auto", "native", "transformers")
