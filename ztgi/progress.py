"""The progress bar of an offline run: prompts done, and input and output tokens per second."""

from __future__ import annotations

import time

from tqdm.auto import tqdm


class Progress:
    """vLLM's bar ("Processed prompts", est. speed input/output toks/s); nothing when off."""

    def __init__(self, num_prompts: int, enabled: bool) -> None:
        self.started = time.perf_counter()
        self.num_input_tokens = 0
        self.num_output_tokens = 0
        self.bar = tqdm(total=num_prompts, desc="Processed prompts", dynamic_ncols=True,
                        postfix=self._speeds(0.0)) if enabled else None

    def prompt_done(self, num_input_tokens: int, num_output_tokens: int) -> None:
        self.num_input_tokens += num_input_tokens
        self.num_output_tokens += num_output_tokens
        if self.bar is not None:
            self.bar.postfix = self._speeds(time.perf_counter() - self.started)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _speeds(self, elapsed_s: float) -> str:
        if elapsed_s <= 0:
            return "est. speed input: 0.00 toks/s, output: 0.00 toks/s"
        return (f"est. speed input: {self.num_input_tokens / elapsed_s:.2f} toks/s, "
                f"output: {self.num_output_tokens / elapsed_s:.2f} toks/s")
