"""Starts, watches and stops every service of one host."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

from ztgi.common.health_probe import is_healthy
from ztgi.services.launcher.child import Child
from ztgi.services.launcher.config import LaunchConfig

logger = logging.getLogger(__name__)

SHUTDOWN_ORDER = ("gateway", "scheduler", "tokenizer", "worker")


class StartupError(RuntimeError):
    """A child died while the pipeline was starting, or it did not get ready in time."""


class Launcher:
    """The children of one `ztgi launch`, their start, supervision and ordered shutdown."""

    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.owns_run_dir = config.run_dir is None
        self.run_dir = config.run_dir or tempfile.mkdtemp(prefix="ztgi-")
        self.scheduler_url = f"ipc://{self.run_dir}"
        self.children = self._plan()
        self.stopping = False

    def _plan(self) -> list[Child]:
        config = self.config
        env = config.shared_environment(self.scheduler_url)
        children = [Child("scheduler", "scheduler", [], env)]
        # CPU workers on one host share its cores instead of each spinning a thread per core (a group
        # of --num-shard ranks splits its worker's share)
        num_threads = max(1, (os.cpu_count() or 1) // config.num_workers)
        children += [Child(f"worker[{i}]", "worker", ["--worker-index", str(i), "--num-threads", str(num_threads)], env)
                     for i in range(config.num_workers)]
        children += [Child(f"tokenizer[{i}]", "tokenizer", ["--tokenizer-index", str(i)], env)
                     for i in range(config.num_tokenizers)]
        # several gateways share one port: the kernel spreads connections (SO_REUSEPORT)
        gateway_args = ["--host", config.host, "--port", str(config.port),
                        "--shutdown-timeout-s", str(config.drain_timeout_s),
                        "--body-read-timeout-s", str(config.body_read_timeout_s)]
        gateway_args += ["--reuse-port"] if config.num_gateways > 1 else []
        children += [Child(f"gateway[{i}]", "gateway", ["--gateway-index", str(i), *gateway_args], env)
                     for i in range(config.num_gateways)]
        return children

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.config.port}"

    def start(self) -> None:
        for child in self.children:
            child.start()
        logger.info("started %d processes; run directory %s", len(self.children), self.run_dir)

    def wait_ready(self) -> None:
        """Waits until /health answers 200 (workers warmed up), or raises StartupError."""
        deadline = time.monotonic() + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            dead = [c for c in self.children if not c.alive]
            if dead:
                raise StartupError(", ".join(f"{c.name} exited with code {c.returncode}" for c in dead)
                                   + " while starting")
            if is_healthy(self.url):
                return
            if self.stopping:
                raise StartupError("interrupted while starting")
            time.sleep(0.25)
        raise StartupError(f"not ready after {self.config.startup_timeout_s:.0f} s")

    def supervise(self) -> int:
        """Restarts dead children (or stops with 1 when restarts are off) until asked to stop."""
        while not self.stopping:
            for child in self.children:
                if child.alive or self.stopping:
                    continue
                if not self.config.restart:
                    logger.error("%s exited with code %s; stopping (restarts are off)", child.name, child.returncode)
                    return 1
                logger.warning("%s exited with code %s; restarting", child.name, child.returncode)
                if self._sleep_unless_stopping(self.config.restart_backoff_s):
                    break  # a child started now would get SIGTERM before it could handle it
                child.num_restarts += 1
                child.start()
            time.sleep(0.2)
        return 0

    def _sleep_unless_stopping(self, seconds: float) -> bool:
        """Sleeps up to `seconds`; returns True as soon as a stop is requested."""
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, deadline - time.monotonic()))
        return self.stopping

    def request_stop(self) -> None:
        """A stop signal: startup and supervision end at their next check, then `shutdown` runs."""
        self.stopping = True

    def shutdown(self) -> bool:
        """Stops gateways, then the scheduler, tokenizers and workers; removes the run directory.

        Returns whether every child exited with code 0; each exit code is logged.
        """
        self.stopping = True
        for service in SHUTDOWN_ORDER:
            group = [c for c in self.children if c.service == service]
            for child in group:
                child.terminate()
            for child in group:
                child.wait(self.config.shutdown_timeout_s)
                level = logging.INFO if child.returncode == 0 else logging.WARNING
                logger.log(level, "%s exited with code %s", child.name, child.returncode)
        if self.owns_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        clean = all(child.returncode == 0 for child in self.children)
        logger.info("all processes stopped%s", "" if clean else " (not all cleanly)")
        return clean
