"""Qwen2-VL's multimodal rotary positions: (temporal, height, width) for every token of a prompt.

transformers' `get_rope_index`, for one sequence: text tokens count up by one in all three; an
image's tokens get the grid's coordinates (after the patch merge) offset by the position reached,
which then moves on by the grid's longer side. Tokens past the prompt (generated ones, drafts) sit
at `t + delta` in all three, `delta` being how far the prompt's last position fell behind its length.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class MropePositions:
    """A prompt's `[3, len]` positions and the offset of every token after it."""

    table: torch.Tensor  # [3, prompt tokens], int64
    delta: int

    @classmethod
    def for_prompt(cls, num_tokens: int, runs: list[tuple[int, int, tuple[int, int, int]]],
                   spatial_merge_size: int) -> MropePositions:
        """`runs`: each image's (first placeholder, count, grid t/h/w), in order in the prompt;
        ValueError where a run's count is not its merged grid's size."""
        parts, position, cursor = [], 0, 0
        for first, count, grid in runs:
            parts.append(torch.arange(first - cursor).expand(3, -1) + position)
            position += first - cursor
            image = _grid_positions(grid, spatial_merge_size) + position
            if image.shape[1] != count:
                raise ValueError(f"an image grid {list(grid)} merged by {spatial_merge_size} makes {image.shape[1]} "
                                 f"tokens but its span holds {count}")
            parts.append(image)
            position += max(grid[1], grid[2]) // spatial_merge_size
            cursor = first + count
        parts.append(torch.arange(num_tokens - cursor).expand(3, -1) + position)
        table = torch.cat(parts, dim=1)
        return cls(table, int(table.max()) + 1 - num_tokens)

    def positions(self, start: int, count: int) -> list[list[int]]:
        """Tokens `[start, start + count)`: three lists (temporal, height, width)."""
        end, known = start + count, self.table.shape[1]
        rows = self.table[:, start:min(end, known)].tolist() if start < known else [[], [], []]
        beyond = list(range(max(start, known) + self.delta, end + self.delta))
        return [row + beyond for row in rows]


def _grid_positions(grid: tuple[int, int, int], spatial_merge_size: int) -> torch.Tensor:
    """`[3, t * h * w]` after the merge, in the order the encoder's rows come (t, then h, then w)."""
    t, h, w = grid[0], grid[1] // spatial_merge_size, grid[2] // spatial_merge_size
    temporal, height, width = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([temporal, height, width]).reshape(3, -1)
