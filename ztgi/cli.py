"""`ztgi`: the one entry point for every command of the project.

    ztgi launch     all services on one host (what `make run` runs)
    ztgi scheduler  the hub
    ztgi tokenizer  one tokenizer replica
    ztgi worker     one model worker
    ztgi gateway    one HTTP gateway replica
    ztgi balancer   one TCP port in front of every gateway replica (docker-compose.yml's 8080)
    ztgi bench      benchmarks: serve (the load generator, the default), latency, throughput, compare,
                    llama-cpp, static, engine (`ztgi bench --help`)
    ztgi keygen     a CURVE keypair for encrypted links (ztgi keygen DIR NAME)
    ztgi probe      whether a worker or tokenizer is ready, from its --ready-file (a Kubernetes exec probe)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from ztgi.common.early_stop import exit_after


def _launch(argv: Sequence[str]) -> int:
    from ztgi.services.launcher.service import main
    return main(argv)


def _scheduler(argv: Sequence[str]) -> int:
    from ztgi.services.scheduler.service import main
    return main(argv)


def _tokenizer(argv: Sequence[str]) -> int:
    from ztgi.services.tokenizer.without_torch import keep_torch_out

    keep_torch_out()
    from ztgi.services.tokenizer.service import main
    return main(argv)


def _worker(argv: Sequence[str]) -> int:
    from ztgi.common.huge_pages import ask_for_huge_pages

    ask_for_huge_pages()
    from ztgi.services.worker.service import main
    return main(argv)


def _gateway(argv: Sequence[str]) -> int:
    from ztgi.services.gateway.service import main
    return main(argv)


def _balancer(argv: Sequence[str]) -> int:
    from ztgi.services.balancer.service import main
    return main(argv)


def _bench(argv: Sequence[str]) -> int:
    from ztgi.bench.commands import main
    return main(argv)


def _keygen(argv: Sequence[str]) -> int:
    from ztgi.common.curve import main
    return main(argv)


def _probe(argv: Sequence[str]) -> int:
    from ztgi.common.ready_file import main
    return main(argv)


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "launch": _launch,
    "scheduler": _scheduler,
    "tokenizer": _tokenizer,
    "worker": _worker,
    "gateway": _gateway,
    "balancer": _balancer,
    "bench": _bench,
    "keygen": _keygen,
    "probe": _probe,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:]) or 0


def console_main() -> None:
    """The `ztgi` command's process: `main`, then deaf to stop signals while it exits (a late stop
    signal must not kill it half-way, early_stop.py). `main` alone leaves the signals as they are,
    for a caller that goes on living (a test, a notebook)."""
    exit_after(main)


if __name__ == "__main__":
    console_main()
