"""Images for vision-language models: the tensors a request carries, their encoder, and where the rows go.

Below `models/` (loading builds the encoder) and above `layers/`: the paged engine reads a
sequence's `PromptImages` to replace the placeholder tokens' embeddings and, for Qwen2-VL, to give
its tokens their multimodal rotary positions (`MropePositions`).
"""
