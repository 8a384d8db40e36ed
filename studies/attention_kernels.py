"""The candidate CPU kernels for paged decode attention, timed on SmolLM2-135M's shapes.

    python -m studies.attention_kernels --batch-sizes 8 32 64 --context 300 --repeats 30

Each candidate computes the same thing: one new query token per request attending over that
request's keys and values, which live in a block pool (`[blocks, block_size, kv_heads, head_dim]`)
at the block ids of its block table; contexts vary around `--context` (0.25x to 1.75x, as mixed
traffic does). `padded` is the reference the paged engine replaces: SDPA over a contiguous
left-padded `[batch, kv_heads, longest, head_dim]` cache that needs no gather. Prints the median
time per layer call of each candidate and its ratio to `padded`, one intra-op thread by default.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16


def _inputs(batch_size: int, context: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    lengths = [max(1, int(context * (0.25 + 1.5 * i / max(1, batch_size - 1)))) for i in range(batch_size)]
    blocks_each = [-(-n // BLOCK_SIZE) for n in lengths]
    num_blocks = sum(blocks_each) + 1
    order = torch.randperm(num_blocks - 1, generator=generator) + 1  # scattered, as after churn
    tables, start = [], 0
    for count in blocks_each:
        tables.append(order[start:start + count].tolist())
        start += count
    width = max(blocks_each)
    table = torch.zeros((batch_size, width), dtype=torch.int64)
    for row, blocks in enumerate(tables):
        table[row, :len(blocks)] = torch.tensor(blocks)
    pool_shape = (num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    keys, values = torch.randn(pool_shape, generator=generator), torch.randn(pool_shape, generator=generator)
    mask = torch.arange(width * BLOCK_SIZE)[None, :] < torch.tensor(lengths)[:, None]
    longest = max(lengths)
    padded_k = torch.zeros(batch_size, KV_HEADS, longest, HEAD_DIM)
    padded_v = torch.zeros_like(padded_k)
    for row, blocks in enumerate(tables):
        n = lengths[row]
        padded_k[row, :, longest - n:] = keys[blocks].flatten(0, 1)[:n].transpose(0, 1)
        padded_v[row, :, longest - n:] = values[blocks].flatten(0, 1)[:n].transpose(0, 1)
    padded_mask = torch.arange(longest)[None, :] >= longest - torch.tensor(lengths)[:, None]
    return dict(q=torch.randn(batch_size, HEADS, HEAD_DIM, generator=generator), keys=keys, values=values,
                table=table, mask=mask[:, None, None, :], lengths=lengths, tables=tables,
                padded_k=padded_k, padded_v=padded_v, padded_mask=padded_mask[:, None, None, :])


def padded(x: dict) -> torch.Tensor:
    return F.scaled_dot_product_attention(x["q"].unsqueeze(2), x["padded_k"], x["padded_v"],
                                          attn_mask=x["padded_mask"], enable_gqa=True).squeeze(2)


def gathered_sdpa(x: dict) -> torch.Tensor:
    """The paged engine's kernel: gather every row's blocks, one masked SDPA call."""
    rows, width = x["table"].shape
    shape = (rows, width * BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k = x["keys"][x["table"]].view(shape).transpose(1, 2)
    v = x["values"][x["table"]].view(shape).transpose(1, 2)
    return F.scaled_dot_product_attention(x["q"].unsqueeze(2), k, v, attn_mask=x["mask"], enable_gqa=True).squeeze(2)


def per_request_sdpa(x: dict) -> torch.Tensor:
    """One SDPA call per request over exactly its keys: no padding, no mask, a call each."""
    out = []
    for row, (blocks, n) in enumerate(zip(x["tables"], x["lengths"])):
        k = x["keys"][blocks].flatten(0, 1)[:n].transpose(0, 1).unsqueeze(0)
        v = x["values"][blocks].flatten(0, 1)[:n].transpose(0, 1).unsqueeze(0)
        out.append(F.scaled_dot_product_attention(x["q"][row:row + 1].unsqueeze(2), k, v, enable_gqa=True))
    return torch.cat(out).squeeze(2)


def _fused_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, table: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
    rows = q.shape[0]
    k = keys[table].flatten(1, 2)  # [rows, positions, kv_heads, head_dim]
    v = values[table].flatten(1, 2)
    q = q.view(rows, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
    scores = torch.einsum("rkgd,rpkd->rkgp", q, k) * HEAD_DIM ** -0.5
    scores = scores.masked_fill(~mask.view(rows, 1, 1, -1), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("rkgp,rpkd->rkgd", weights, v).reshape(rows, HEADS, HEAD_DIM)


_compiled = torch.compile(_fused_decode, dynamic=True)


def compiled_gather(x: dict) -> torch.Tensor:
    """Inductor's fusion of the gather, the scores, the softmax and the weighted sum."""
    return _compiled(x["q"], x["keys"], x["values"], x["table"], x["mask"].view(x["q"].shape[0], -1))


_workspace: dict[str, torch.Tensor] = {}


def _gather_into(name: str, pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """`pool[table]` written into a buffer kept between calls (no fresh pages to fault in)."""
    flat = pool.view(pool.shape[0], -1)
    size = table.numel() * flat.shape[1]
    if name not in _workspace or _workspace[name].numel() < size:
        _workspace[name] = flat.new_empty(size)
    out = _workspace[name][:size].view(table.numel(), flat.shape[1])
    torch.index_select(flat, 0, table.view(-1), out=out)
    return out


def gathered_sdpa_workspace(x: dict) -> torch.Tensor:
    """`gathered_sdpa` gathering into a kept workspace."""
    rows, width = x["table"].shape
    shape = (rows, width * BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k = _gather_into("k", x["keys"], x["table"]).view(shape).transpose(1, 2)
    v = _gather_into("v", x["values"], x["table"]).view(shape).transpose(1, 2)
    return F.scaled_dot_product_attention(x["q"].unsqueeze(2), k, v, attn_mask=x["mask"], enable_gqa=True).squeeze(2)


def gathered_einsum(x: dict) -> torch.Tensor:
    """The same arithmetic as `compiled_gather`, eager: a gather, two einsums and a softmax."""
    return _fused_decode(x["q"], x["keys"], x["values"], x["table"], x["mask"].view(x["q"].shape[0], -1))


def gathered_sdpa_contiguous(x: dict) -> torch.Tensor:
    """`gathered_sdpa` with the gathered keys and values laid out heads-first before SDPA."""
    rows, width = x["table"].shape
    shape = (rows, width * BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k = x["keys"][x["table"]].view(shape).transpose(1, 2).contiguous()
    v = x["values"][x["table"]].view(shape).transpose(1, 2).contiguous()
    return F.scaled_dot_product_attention(x["q"].unsqueeze(2), k, v, attn_mask=x["mask"], enable_gqa=True).squeeze(2)


CANDIDATES: dict[str, Callable[[dict], torch.Tensor]] = {
    "padded": padded, "gathered_sdpa": gathered_sdpa, "gathered_sdpa_workspace": gathered_sdpa_workspace,
    "gathered_sdpa_contiguous": gathered_sdpa_contiguous,
    "per_request_sdpa": per_request_sdpa, "gathered_einsum": gathered_einsum, "compiled_gather": compiled_gather,
}


def _median_ms(fn: Callable[[dict], torch.Tensor], x: dict, repeats: int) -> float:
    fn(x)
    fn(x)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _labelled(name: str, message: str) -> str:
    return f"{name}: {message}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("median ms per layer call (ratio to padded)")
    print(f"{'batch':>5} " + " ".join(f"{name:>24}" for name in CANDIDATES))
    with torch.inference_mode():
        for batch_size in args.batch_sizes:
            x = _inputs(batch_size, args.context)
            reference = padded(x)
            for name, fn in CANDIDATES.items():
                torch.testing.assert_close(fn(x), reference, atol=1e-4, rtol=1e-4,
                                           msg=functools.partial(_labelled, name))
            medians = {name: _median_ms(fn, x, args.repeats) for name, fn in CANDIDATES.items()}
            cells = " ".join(f"{ms:>15.3f} ({ms / medians['padded']:4.2f}x)" for ms in medians.values())
            print(f"{batch_size:>5} {cells}")


if __name__ == "__main__":
    main()
