
from ztgi.common.early_stop import exit_after, exit_on_stop_signals

exit_on_stop_signals()

from ztgi.services.gateway.service import main  # noqa: E402 (after the stop hook: this import is the slow part)

exit_after(main)
