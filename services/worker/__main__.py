
from ztgi.common.early_stop import exit_after, exit_on_stop_signals

exit_on_stop_signals()

from ztgi.common.huge_pages import ask_for_huge_pages  # noqa: E402 (before torch loads)

ask_for_huge_pages()

from ztgi.services.worker.service import main  # noqa: E402 (after the stop hook: this import is the slow part)

exit_after(main)
