"""Network namespaces joined by veth pairs: hosts apart on one machine, for tests run as root.

A `Network` makes a hub namespace (the scheduler's host) and links other namespaces to it, each
by a veth pair on a /24 of its own: the hub end takes `.1`, the other end `.2`. The other end may
be the root namespace (where the test itself runs). A linked namespace has no route beyond its
own /24 and forwarding is off in the hub, so a process there reaches the hub's address on its
link and nothing else. `cut` takes a link down on the hub side (both ends lose carrier, as when a
cable is pulled); `restore` brings it back with its addresses.

Names carry a random suffix (parallel runs do not collide; a leftover is recognisable) and
`close` removes everything made, whatever happened before: deleting a namespace deletes the veth
ends inside it, and with them their peers.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import secrets
import shutil
import subprocess


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here: not root, no `ip`, or a kernel or sandbox that refuses."""


@dataclasses.dataclass(frozen=True)
class Link:
    """One veth pair: `hub_device` in the hub namespace, `device` in `namespace` (None: root)."""

    hub_device: str
    device: str
    hub_address: str
    address: str
    namespace: str | None


def ip_command(*args: str, namespace: str | None = None) -> list[str]:
    """`ip [-n NAMESPACE] ARGS`: ARGS in `namespace` (None: the root namespace)."""
    return ["ip", *(("-n", namespace) if namespace else ()), *args]


def ip(*args: str, namespace: str | None = None) -> str:
    """Runs `ip_command`; its output, or CalledProcessError with its message."""
    return subprocess.run(ip_command(*args, namespace=namespace), check=True, capture_output=True, text=True,
                          timeout=30).stdout


class Network:
    """A hub namespace and the links made to it; `close` undoes them all."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("no `ip` command (iproute2)")
        self.suffix = secrets.token_hex(3)
        self.second_octet = self._free_second_octet()
        self.namespaces: list[str] = []
        self.root_devices: list[str] = []
        self.links: list[Link] = []
        try:
            self.hub = self.add_namespace("hub")
        except subprocess.CalledProcessError as exc:
            self.close()
            raise NetnsUnavailable(f"`ip netns add` failed: {exc.stderr.strip()}") from None

    def _free_second_octet(self) -> int:
        """A 10.X.0.0/16 with no address of the root namespace in it: the root end of a link
        takes one, and must not shadow a network the machine uses."""
        used = ip("-4", "-o", "addr", "show") + ip("-4", "route", "show")
        return random.choice([x for x in range(64, 250) if not re.search(rf"\b10\.{x}\.", used)])

    def add_namespace(self, role: str) -> str:
        """A new namespace with its loopback up; its name."""
        name = f"ztgi-{self.suffix}-{role}"
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("link", "set", "lo", "up", namespace=name)
        return name

    def link(self, namespace: str | None) -> Link:
        """A veth pair from the hub to `namespace` (None: the root namespace) on the next /24."""
        index = len(self.links) + 1
        subnet = f"10.{self.second_octet}.{index}"
        link = Link(hub_device=f"zh{self.suffix}{index}", device=f"zp{self.suffix}{index}",
                    hub_address=f"{subnet}.1", address=f"{subnet}.2", namespace=namespace)
        ip("link", "add", link.device, "type", "veth", "peer", "name", link.hub_device)
        if namespace is None:
            self.root_devices.append(link.device)
        else:
            ip("link", "set", link.device, "netns", namespace)
        ip("link", "set", link.hub_device, "netns", self.hub)
        ip("addr", "add", f"{link.hub_address}/24", "dev", link.hub_device, namespace=self.hub)
        ip("addr", "add", f"{link.address}/24", "dev", link.device, namespace=namespace)
        ip("link", "set", link.hub_device, "up", namespace=self.hub)
        ip("link", "set", link.device, "up", namespace=namespace)
        self.links.append(link)
        return link

    def cut(self, link: Link) -> None:
        ip("link", "set", link.hub_device, "down", namespace=self.hub)

    def restore(self, link: Link) -> None:
        ip("link", "set", link.hub_device, "up", namespace=self.hub)

    def addresses(self, namespace: str) -> list[str]:
        """Every IPv4 address in `namespace`, loopback included."""
        listing = ip("-4", "-o", "addr", "show", namespace=namespace)
        return [line.split()[3].split("/")[0] for line in listing.splitlines()]

    def routes_to(self, namespace: str | None, address: str) -> bool:
        """Whether `namespace` (None: root) has a route to `address`."""
        command = ip_command("route", "get", address, namespace=namespace)
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0

    def exec_prefix(self, namespace: str | None) -> list[str]:
        """What runs a command inside `namespace` (`ip netns exec` execs it: same pid)."""
        return [] if namespace is None else ["ip", "netns", "exec", namespace]

    def close(self) -> None:
        """Removes every namespace and root-side device made; carries on past failures."""
        for device in self.root_devices:
            subprocess.run(["ip", "link", "del", device], capture_output=True, timeout=30)
        for namespace in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        self.root_devices, self.namespaces = [], []
