"""One-off studies: each settled a design question once (studies/README.md lists them).

Not installed with ztgi; run from the repository root as `python -m studies.<name>`.
"""
