
from ztgi.common.early_stop import exit_after, exit_on_stop_signals
from ztgi.services.tokenizer.without_torch import keep_torch_out

exit_on_stop_signals()
keep_torch_out()

from ztgi.services.tokenizer.service import main  # noqa: E402 (after the stop hook: this import is the slow part)

exit_after(main)
