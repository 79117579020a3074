"""The processes of a launch on several nodes: who runs where, and a lost peer said in one line.

Each process of a run on several processes tells the others, once at the start
(:meth:`Peers.meet`), its rank, its node (torchrun's ``GROUP_RANK``, which ``accelerate
launch`` sets too) and its host's addresses. When a collective then fails because a peer
is gone (killed, crashed, its node down: its sockets close, and gloo and NCCL fail the
next collective at once) or silent past ``train.collective_timeout_s``, :class:`Peers`
(a context manager) turns torch's error into :class:`~simcse_kit.errors.PeerLost`: one
line naming the lost rank and its node as far as the error tells. gloo names the
peer's address only, so a rank is named when exactly one other rank has that address
(always so with two processes); otherwise the line lists the candidates. The CLI adds the
launch command that continues the run (:func:`simcse_kit.cli.resume_command`).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass
from types import TracebackType

import torch.distributed as dist

from simcse_kit.errors import PeerLost

__all__ = ["Peer", "Peers", "is_peer_failure", "peer_address"]

logger = logging.getLogger(__name__)

# What torch raises when a collective's peer is gone or silent. gloo: "Connection closed
# by peer [10.0.0.2]:41893", "Connection reset by peer", "Broken pipe", "Timed out waiting
# 300000ms for recv operation"; NCCL: "NCCL communicator was aborted", "Watchdog caught
# collective operation timeout"; the store: "Connection reset by peer" on TCPStore.
FAILURE = re.compile(
    r"connection (closed|reset) by peer|broken pipe|timed out waiting|collective operation timeout|"
    r"nccl communicator was aborted|nccl error|socket timeout|connection refused",
    re.IGNORECASE,
)
ADDRESS = re.compile(r"\[([0-9a-fA-F.:]+)\]:(\d+)")  # gloo's "[host]:port" of the peer


@dataclass(frozen=True)
class Peer:
    """One process of the launch: its global ``rank``, its ``node`` and its host."""

    rank: int
    node: int
    host: str
    addresses: tuple[str, ...]


def this_peer() -> Peer:
    """This process: rank and node from the launcher's environment (torchrun and
    ``accelerate launch`` set ``RANK``, ``GROUP_RANK``, ``LOCAL_WORLD_SIZE``), its
    hostname and the addresses it is reached at (its hostname's, and the one on the route to
    the rendezvous host, which is what gloo binds to when the hostname does not resolve)."""
    rank = int(os.environ.get("RANK", "0"))
    node = os.environ.get("GROUP_RANK")
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    host = socket.gethostname()
    addresses: set[str] = set()
    try:
        addresses |= {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        pass
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))  # UDP: no packet is sent
                addresses.add(s.getsockname()[0])
        except OSError:
            pass
    return Peer(rank, int(node) if node is not None else rank // local, host, tuple(sorted(addresses)))


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because a peer is gone or silent."""
    if isinstance(exc, dist.DistError) and not isinstance(exc, dist.DistStoreError):
        return True
    return isinstance(exc, RuntimeError) and FAILURE.search(str(exc)) is not None


def peer_address(exc: BaseException) -> str | None:
    """The peer's address named in torch's error (gloo's ``[host]:port``), if any."""
    found = ADDRESS.search(str(exc))
    return found.group(1) if found else None


class Peers:
    """The launch's processes (after :meth:`meet`), and a context manager that turns a
    collective failed by a lost peer into :class:`~simcse_kit.errors.PeerLost`."""

    def __init__(self) -> None:
        self.me = this_peer()
        self.all: list[Peer] = [self.me]

    def meet(self) -> None:
        """Every process's :class:`Peer`, on every process (a collective: all must call it;
        nothing on one process)."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Peer | None] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, self.me)
            self.all = [p for p in gathered if p is not None]

    def lost(self, exc: BaseException) -> PeerLost:
        """One line: which peer is lost (as far as ``exc`` tells), and why."""
        me = self.me
        others = [p for p in self.all if p.rank != me.rank]
        address = peer_address(exc)
        if address is not None and others:
            loopback = address.startswith("127.") or address == "::1"
            # On one host every process has the loopback address: the peers on this host.
            at = [p for p in others if (p.host == me.host if loopback else address in p.addresses)]
            others = at or others
        reason = next((line.strip() for line in str(exc).splitlines() if FAILURE.search(line)), "")
        reason = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", reason)  # gloo's source line
        # gloo goes on ("This is typically caused by a remote worker hanging ... GLHF!"): its first sentence.
        reason = re.split(r"\.\s", reason, maxsplit=1)[0].rstrip(".") or type(exc).__name__
        timed_out = re.search(r"timed? ?out", reason, re.IGNORECASE) is not None
        if len(others) == 1:
            who = f"rank {others[0].rank} (node {others[0].node}{', ' + others[0].host if others[0].host != me.host else ''})"
        elif others:
            nodes = sorted({p.node for p in others})
            who = f"one of ranks {', '.join(str(p.rank) for p in others)} (node{'s' if len(nodes) > 1 else ''} "
            who += f"{', '.join(map(str, nodes))})"
        else:
            who = "a peer process"
        what = "heard nothing from" if timed_out else "lost"
        where = f" at {address}" if address else ""
        hint = " (train.collective_timeout_s)" if timed_out else ""
        return PeerLost(f"rank {me.rank} (node {me.node}) {what} {who}{where}: {reason}{hint}")

    def __enter__(self) -> Peers:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        several = len(self.all) > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1  # one process has no peer to lose
        if exc is not None and several and not isinstance(exc, PeerLost) and is_peer_failure(exc):
            logger.debug("collective failed", exc_info=exc)
            raise self.lost(exc) from exc
