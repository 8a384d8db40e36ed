"""`python -m ztgi`: the same as the `ztgi` command."""

from ztgi.cli import console_main

console_main()
