"""A vision-language model's text part split over two ranks (each encodes the images itself): the
whole model's greedy ids, Qwen2-VL's multimodal positions included."""

from __future__ import annotations

import dataclasses
import functools

from tests.worker.engine_helpers import request, run_chunked, token_ids
from tests.worker.shards.rank_runs import run_in_group
from tests.worker.vision.image_prompts import image_prompt, pictures
from ztgi.common.messages import WorkerRequest
from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.shards.shard_group import ShardGroup


def _generate(dirs: dict[str, str], requests: dict[str, list[WorkerRequest]],
              group: ShardGroup | None = None) -> dict[str, dict[int, list[int]]]:
    out = {}
    for family, directory in dirs.items():
        model = load_model(directory, dtype="float32", device="cpu", kv_cache="paged", block_size=4, group=group)
        model.allocate_pool(64)
        out[family] = token_ids(run_chunked(model, requests[family], 5))
    return out


def test_two_ranks_generate_what_the_whole_model_does(vision_dirs):
    """Two images and a text prompt, chunks of 5, in two gloo ranks: the ids of the model in one piece."""
    dirs = {family: vision_dirs[family] for family in ("idefics3", "qwen2_vl")}
    requests = {}
    for family, directory in dirs.items():
        prompts = [image_prompt(family, directory, pictures(2)), image_prompt(family, directory, [], "Hello there.")]
        requests[family] = [dataclasses.replace(request(i, p.input_ids, 6, ignore_eos=True), images=p.images)
                            for i, p in enumerate(prompts)]
    whole = _generate(dirs, requests)
    ranks = run_in_group(2, functools.partial(_generate, dirs, requests))
    assert ranks == [whole, whole]
