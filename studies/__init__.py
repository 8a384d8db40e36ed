"""One-off studies: each settled a design question once. Not installed; run from the repository root as `python -m studies.<name>`."""
