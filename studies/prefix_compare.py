"""Two `ztgi bench --output` files of the same workload, caching on and off, side by side:
`python -m studies.prefix_compare ON.json OFF.json`. Prints TTFT, E2E and throughput of each,
the ratio, whether every request's text is the same in both, and the cached tokens reported."""

from __future__ import annotations

import json
import sys


def _run(path: str) -> dict:
    with open(path, encoding="utf-8") as file:
        return json.load(file)["runs"][0]


def main(argv: list[str]) -> int:
    on, off = _run(argv[0]), _run(argv[1])
    rows = [("TTFT p50 (ms)", lambda s: s["ttft_s"]["p50"] * 1e3),
            ("TTFT p90 (ms)", lambda s: s["ttft_s"]["p90"] * 1e3),
            ("E2E p50 (ms)", lambda s: s["e2e_s"]["p50"] * 1e3), ("duration (s)", lambda s: s["duration_s"]),
            ("output tok/s", lambda s: s["output_token_throughput"]), ("req/s", lambda s: s["request_throughput"])]
    print(f"{'':16}{'caching on':>12}{'caching off':>12}{'off/on':>9}")
    for name, value in rows:
        a, b = value(on["summary"]), value(off["summary"])
        print(f"{name:16}{a:12.1f}{b:12.1f}{b / a if a else float('nan'):9.2f}")
    texts_on = {r["request_id"]: r["text"] for r in on["requests"]}
    texts_off = {r["request_id"]: r["text"] for r in off["requests"]}
    same = sum(texts_on[i] == texts_off.get(i) and texts_on[i] is not None for i in texts_on)
    cached = [r["cached_tokens"] for r in on["requests"]]
    print(f"same text: {same} of {len(texts_on)}; failures on/off: {on['summary']['num_failures']}/"
          f"{off['summary']['num_failures']}")
    print(f"cached_tokens on: reported on {sum(c is not None for c in cached)} answers, "
          f"{sum(1 for c in cached if c)} > 0, min {min(c or 0 for c in cached)}, max {max(c or 0 for c in cached)}; "
          f"off: max {max(r['cached_tokens'] or 0 for r in off['requests'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
