"""One job across nodes: the job view every node's ``auditor run`` streams to and reads from.

A job launched on several nodes (``torchrun --nnodes=N``, each node under its own ``auditor
run --address``) is one job: each node's driver pushes the batches its node agent drained to one
named Ray actor per job (``auditor-job-<key>`` in the ``auditor`` namespace, created by the first
node with ``get_if_exists``, placed on the head node, detached until the last node leaves) and
pulls every other node's batches from it. Every node then judges the whole job with the same
rules, so each node's live table, verdict and reports cover all ranks, labelled with their node.

* Grouping: :func:`job_key` (``--job`` when given, else torchrun's rendezvous endpoint and run
  id, both parsed from the command line): two jobs on one cluster never merge.
* Members: each run is one node of the job, named by :func:`member_name` (its node's name, and
  torchrun's node rank, so two torchrun agents of one job on one host are two nodes). A second
  run that claims a name a running run holds is refused (:class:`NodeClashError`): its samples
  would be taken for the other's.
* Clocks: samples keep their node's timestamps on the wire; the view estimates each node's clock
  offset from its own clock at every push and pull, and hands a reader the samples shifted into
  the reader's clock, so a window cut by the reader's "now" holds the same recent steps of every
  node. Rules judge per-step durations, which no offset touches.
* Memory: the view keeps the batches of the last ``keep_s`` seconds (and the latest info of
  every rank), not the run.
* Faults: a node that stops pushing for ``lost_after_s``, or whose Ray node is dead, is marked
  lost (its samples kept); the others go on.

No new port and no rendezvous of its own: Ray's GCS names the actor, Ray carries the batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from auditor.samples import Batch, RankInfo
from auditor.torchrun import torchrun_args

log = logging.getLogger(__name__)

NAMESPACE = "auditor"
ACTOR_PREFIX = "auditor-job-"
# A node that pushed nothing for this long is lost (a driver pushes about once a second).
LOST_AFTER_S = 10.0
# Once a node's job ended: another node silent this long is lost (its ranks ended with ours,
# a live driver pushes every second).
FINAL_SILENCE_S = 3.0
# A node with nothing new still tells the view it is alive this often.
HEARTBEAT_S = 1.0
# How long the view keeps batches for readers that fall behind (or join late).
KEEP_S = 120.0
# A view nobody pushed to or read from for this long removes itself (every driver died).
IDLE_EXIT_S = 600.0

RUNNING, DONE, LOST = "running", "done", "lost"


# --- grouping ------------------------------------------------------------------------------------
def job_key(job: str | None, command: Sequence[str], env: Mapping[str, str]) -> str | None:
    """What every node's ``auditor run`` of one job has in common, and no other job has.

    ``--job`` when given. Else, for a torchrun launch over more than one node, its rendezvous:
    the endpoint (``--rdzv_endpoint``, or ``--master_addr:--master_port`` for the static
    rendezvous) and the run id (``--rdzv_id``); torchrun's ``PET_*`` environment variables stand
    in for options not on the command line. None: a single-node job (nothing to join)."""
    if job:
        return f"job:{job}"
    args = torchrun_args(command)
    if args is None:
        return None

    def opt(name: str, default: str = "") -> str:
        return args.get(name) or env.get("PET_" + name.upper(), "") or default

    nnodes = opt("nnodes", "1")
    if "standalone" in args or nnodes.split(":")[-1] in ("", "1"):
        return None
    endpoint = opt("rdzv_endpoint")
    if not endpoint:
        addr = opt("master_addr", "127.0.0.1")
        endpoint = f"{addr}:{opt('master_port', '29500')}"
    return f"rdzv:{endpoint}/{opt('rdzv_id', 'none')}"


def member_name(node: str, node_rank: int | str | None) -> str:
    """A run's name in the job view: its node's name, with torchrun's node rank when known, or
    the launcher's name for one of several runs on one node (``task1``: a SLURM task's run)."""
    if node_rank is None:
        return node
    return f"{node}/{node_rank}" if isinstance(node_rank, str) else f"{node}/node{node_rank}"


class NodeClashError(RuntimeError):
    """Another run of the job already is this node in the job view; the message says what to
    set."""


def clash_message(node: str) -> str:
    return (
        f"another auditor run of this job is already node {node} in the job view: give each "
        "run its own node, with torchrun's --node_rank or AUDITOR_NODE=<name>"
    )


def actor_name(key: str) -> str:
    """The job view's Ray actor name: a digest, since keys hold ``:`` and ``/``."""
    return ACTOR_PREFIX + hashlib.sha1(key.encode()).hexdigest()[:16]


# --- the view ------------------------------------------------------------------------------------
@dataclass
class NodeState:
    """One node of the job as the view sees it."""

    name: str
    ray_node_id: str = ""
    state: str = RUNNING
    joined: float = 0.0  # view clock
    last_seen: float = 0.0  # view clock
    offset: float = 0.0  # view clock - node clock
    run_id: str = ""  # the run that holds the name ("": any, for callers that give none)
    ranks: set[int] = field(default_factory=set)
    last_step: dict[int, int] = field(default_factory=dict)
    exit_code: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.name,
            "state": self.state,
            "ranks": sorted(self.ranks),
            "last_step": {str(r): s for r, s in sorted(self.last_step.items())},
            "exit_code": self.exit_code,
            "ray_node_id": self.ray_node_id,
        }


def shift_batch(batch: Batch, delta: float) -> Batch:
    """``batch`` with every timestamp moved by ``delta`` seconds (from one clock to another)."""
    if delta == 0.0:
        return batch

    def move(items: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(dataclasses.replace(x, time=x.time + delta) for x in items)

    return dataclasses.replace(
        batch,
        steps=move(batch.steps),
        processes=move(batch.processes),
        nodes=move(batch.nodes),
        devices=move(batch.devices),
        memory=move(batch.memory),
        flops=move(batch.flops),
    )


def label_batch(batch: Batch, node: str) -> Batch:
    """One node's batch labelled with its name in the job: each rank's host (ranks on two
    machines with one hostname, or two runs on one machine, stay apart), and its host and GPU
    samples' node, which the rules match to the ranks by that name (a GPU listing a rank's PID,
    the memory a host's ranks share)."""
    if not (batch.infos or batch.nodes or batch.devices):
        return batch
    return dataclasses.replace(
        batch,
        infos=tuple(
            i if i.host == node else dataclasses.replace(i, host=node) for i in batch.infos
        ),
        nodes=tuple(
            n if n.host == node else dataclasses.replace(n, host=node) for n in batch.nodes
        ),
        devices=tuple(
            d if d.node == node else dataclasses.replace(d, node=node) for d in batch.devices
        ),
    )


class JobViewCore:
    """The job's recent batches from every node (plain Python; the Ray actor wraps it)."""

    def __init__(
        self,
        key: str,
        *,
        keep_s: float = KEEP_S,
        lost_after_s: float = LOST_AFTER_S,
        idle_exit_s: float | None = None,
        clock: Any = time.time,
    ) -> None:
        self.key = key
        self.keep_s = keep_s
        self.lost_after_s = lost_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        # (seq, arrival in view clock, node, batch in view clock), oldest first.
        self._log: deque[tuple[int, float, str, Batch]] = deque()
        self._infos: dict[int, tuple[str, RankInfo]] = {}
        self.nodes: dict[str, NodeState] = {}
        self._last_touch = clock()
        self._dead_ray_nodes: set[str] = set()
        self._released: set[str] = set()
        if idle_exit_s:
            threading.Thread(target=self._idle_exit, args=(idle_exit_s,), daemon=True).start()

    def join(
        self, node: str, ray_node_id: str = "", now: float | None = None, run_id: str = ""
    ) -> dict[str, Any]:
        """``node`` joins (``run_id``: the run that claims the name). The answer says
        ``refused`` when a running run holds that name already."""
        with self._lock:
            t = self._touch()
            self._mark_lost(t)
            if self.nodes and all(s.state != RUNNING for s in self.nodes.values()):
                # Every node of the last run is done or lost: this is a new run of the job
                # (a view a crashed run left behind must not hand its samples to this one).
                self._log.clear()
                self._infos.clear()
                self.nodes.clear()
                self._released.clear()
            st = self.nodes.get(node)
            if st is not None and st.state == RUNNING and not _same_run(st.run_id, run_id):
                return {"key": self.key, "refused": clash_message(node)}
            if st is None or st.state != RUNNING:
                st = NodeState(name=node, ray_node_id=ray_node_id, joined=t, last_seen=t)
                self.nodes[node] = st
            st.run_id = st.run_id or run_id
            if now is not None:
                st.offset = t - now
            return {"key": self.key, "seq": self._seq, "nodes": len(self.nodes)}

    def push(self, node: str, batch: Batch, sent_at: float, run_id: str = "") -> None:
        """``batch`` from ``node``, whose clock read ``sent_at`` when it sent it; dropped when
        another run holds the name (a refused run's pushes were sent before its refusal)."""
        with self._lock:
            t = self._touch()
            st = self.nodes.setdefault(node, NodeState(name=node, joined=t, run_id=run_id))
            if not _same_run(st.run_id, run_id):
                return
            if st.state == LOST:
                st.state = RUNNING  # it came back
            st.last_seen = t
            st.offset = t - sent_at
            batch = shift_batch(label_batch(batch, node), st.offset)
            for info in batch.infos:
                self._infos[info.rank] = (node, info)
                st.ranks.add(info.rank)
            for s in batch.steps:
                st.ranks.add(s.rank)
                st.last_step[s.rank] = max(st.last_step.get(s.rank, -1), s.step)
            self._seq += 1
            self._log.append((self._seq, t, node, batch))
            self._trim(t)

    def pull(self, node: str, cursor: int, now: float) -> tuple[int, list[Batch], list[dict]]:
        """Every other node's batches after ``cursor``, shifted into the reader's clock (which
        reads ``now``); the new cursor; and every node's state."""
        with self._lock:
            t = self._touch()
            self._mark_lost(t)
            back = now - t  # view clock -> reader clock
            out: list[Batch] = []
            oldest = self._log[0][0] if self._log else self._seq + 1
            if cursor < oldest - 1:
                # Fell behind (or joined late): what the view dropped is gone, but the ranks
                # it knows are still named.
                infos = tuple(i for n, i in self._infos.values() if n != node)
                if infos:
                    out.append(Batch(infos=infos))
            for seq, _, src, batch in self._log:
                if seq > cursor and src != node:
                    out.append(shift_batch(batch, back))
            return self._seq, out, [s.to_dict() for s in self.nodes.values()]

    def leave(self, node: str, exit_code: int | None = None, run_id: str = "") -> None:
        """``node``'s job ended (it still reads the others' last samples, then releases)."""
        with self._lock:
            t = self._touch()
            st = self.nodes.setdefault(node, NodeState(name=node, joined=t, run_id=run_id))
            if not _same_run(st.run_id, run_id):
                return
            st.state, st.exit_code, st.last_seen = DONE, exit_code, t

    def release(self, node: str) -> int:
        """``node`` is gone; returns how many nodes may still read (neither released nor
        lost): at zero the view can go."""
        with self._lock:
            self._mark_lost(self._touch())
            self._released.add(node)
            return sum(
                1 for s in self.nodes.values() if s.name not in self._released and s.state != LOST
            )

    def states(self, silent_s: float | None = None) -> list[dict[str, Any]]:
        """Every node's state; ``silent_s``: a shorter silence that marks a node lost (a node
        whose job ended waits that long for the others' last samples, not ``lost_after_s``)."""
        with self._lock:
            self._mark_lost(self._clock(), silent_s)
            return [s.to_dict() for s in self.nodes.values()]

    def set_dead_ray_nodes(self, ids: set[str]) -> None:
        with self._lock:
            self._dead_ray_nodes = set(ids)

    def window_batches(self) -> int:
        with self._lock:
            return len(self._log)

    # --- internals (lock held) -----------------------------------------------------------------
    def _touch(self) -> float:
        t = float(self._clock())
        self._last_touch = t
        return t

    def _trim(self, t: float) -> None:
        while self._log and self._log[0][1] < t - self.keep_s:
            self._log.popleft()

    def _mark_lost(self, t: float, silent_s: float | None = None) -> None:
        limit = self.lost_after_s if silent_s is None else silent_s
        for st in self.nodes.values():
            if st.state != RUNNING:
                continue
            silent = t - st.last_seen > limit
            if silent or (st.ray_node_id and st.ray_node_id in self._dead_ray_nodes):
                st.state = LOST

    def _idle_exit(self, idle_s: float) -> None:
        while True:
            time.sleep(min(idle_s, 30.0))
            if self._clock() - self._last_touch > idle_s:
                os._exit(0)  # every driver is gone: the detached actor must not linger


def _same_run(holder: str, claimant: str) -> bool:
    """Whether a call from run ``claimant`` may act as the node ``holder`` holds."""
    return not holder or not claimant or holder == claimant


class _RayJobView(JobViewCore):
    """The actor form: also watches Ray's node table, so a lost Ray node reads lost at once."""

    def __init__(self, key: str, **kwargs: Any) -> None:
        super().__init__(key, idle_exit_s=IDLE_EXIT_S, **kwargs)
        threading.Thread(target=self._watch_nodes, daemon=True).start()

    def _watch_nodes(self) -> None:
        import ray

        while True:
            time.sleep(2.0)
            try:
                dead = {str(n.get("NodeID")) for n in ray.nodes() if not n.get("Alive")}
                self.set_dead_ray_nodes(dead)
            except Exception:
                pass


def _head_node_id() -> str | None:
    import ray

    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in (n.get("Resources") or {}):
            return str(n["NodeID"])
    return None


class JobViewClient:
    """One node's link to the job view: push what this node drained, pull the others'.

    Nothing here blocks the live loop: the join and every pull are sent and their answers taken
    when they have come. On a loaded machine the view's actor can take many seconds to start, or
    to answer; a slow answer is not a lost view. Only an error from Ray (the actor died or could
    not be created) or no answer within ``answer_timeout_s`` is.
    """

    def __init__(
        self, key: str, node: str, *, ray_node_id: str = "", answer_timeout_s: float = 60.0
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray = ray
        self.key = key
        self.node = node
        self.name = actor_name(key)
        self._timeout = answer_timeout_s
        # This run's claim on its node's name: a second run claiming the same name is refused.
        self.run_id = uuid.uuid4().hex
        self.cursor = 0
        self.nodes: list[dict[str, Any]] = []
        head = _head_node_id()
        strategy: Any = (
            NodeAffinitySchedulingStrategy(node_id=head, soft=True) if head else "DEFAULT"
        )
        cls = ray.remote(num_cpus=0, num_gpus=0, max_restarts=0)(_RayJobView)
        actor: Any = cls.options(
            name=self.name,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            scheduling_strategy=strategy,
        ).remote(key)
        self._actor = actor
        # One caller's calls reach an actor in the order sent: pushes sent before the join is
        # answered still land after it.
        self._pending: Any = actor.join.remote(node, ray_node_id, time.time(), self.run_id)
        self._joining = True
        self._sent = self._pushed = time.monotonic()

    def push(self, batch: Batch) -> None:
        """Fire and forget: the next pull carries any error. An empty batch still goes out
        once a second, so a node whose ranks have not started yet (torchrun waits for every
        node at the rendezvous) is not taken for lost."""
        now = time.monotonic()
        if not (
            batch.infos
            or batch.steps
            or batch.processes
            or batch.nodes
            or batch.devices
            or (batch.ended or batch.memory or batch.flops)
        ):
            if now - self._pushed < HEARTBEAT_S:
                return
            batch = Batch()
        self._pushed = now
        self._actor.push.remote(self.node, batch, time.time(), self.run_id)

    def pull(self) -> list[Batch]:
        """The other nodes' batches that the last pull brought, if its answer came; then the
        next pull is sent. Raises when the view is gone or silent past the timeout."""
        if self._pending is not None:
            ready, _ = self._ray.wait([self._pending], timeout=0)
            if not ready:
                if time.monotonic() - self._sent > self._timeout:
                    what = "join" if self._joining else "pull"
                    raise TimeoutError(f"no answer to the {what} in {self._timeout:.0f} s")
                return []
        batches = self._take()
        self._pending = self._actor.pull.remote(self.node, self.cursor, time.time())
        self._sent = time.monotonic()
        return batches

    def _take(self, timeout: float | None = None) -> list[Batch]:
        """The answer of the call in flight (waiting up to ``timeout``), or nothing."""
        ref, self._pending = self._pending, None
        if ref is None:
            return []
        answer = self._ray.get(ref, timeout=timeout)
        if self._joining:
            self._joining = False
            if answer.get("refused"):
                raise NodeClashError(answer["refused"])
            return []
        cursor, batches, nodes = answer
        self.cursor, self.nodes = int(cursor), list(nodes)
        return list(batches)

    def finish(self, exit_code: int | None, wait_s: float) -> list[Batch]:
        """This node's job ended and its last batch is pushed: mark it done, give the other
        nodes up to ``wait_s`` to push their last samples (their ranks end with ours), read
        them, and release the view; the last node to release removes it."""
        ray = self._ray
        timeout = self._timeout
        batches = self._take(timeout)  # the pull (or join) in flight: it holds batches too
        ray.get(self._actor.leave.remote(self.node, exit_code, self.run_id), timeout=timeout)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            states = ray.get(self._actor.states.remote(FINAL_SILENCE_S), timeout=timeout)
            if all(s["state"] != RUNNING for s in states if s["node"] != self.node):
                break
            time.sleep(0.3)
        self._pending = self._actor.pull.remote(self.node, self.cursor, time.time())
        batches += self._take(timeout)
        if ray.get(self._actor.release.remote(self.node), timeout=timeout) == 0:
            try:
                ray.kill(self._actor, no_restart=True)
            except Exception:
                pass
        return batches
