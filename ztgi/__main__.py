"""`python -m ztgi`: the same as the `ztgi` command."""

import sys

from ztgi.cli import main

sys.exit(main())
