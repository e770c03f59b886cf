"""The async pipeline's actors: a pool of collector and evaluator slots and their health.

What this module owns
    :class:`ActorPool`: creating each slot's Ray actor in its placement-group bundle, waiting for the
    actors to answer their first ping (with ``actor_start_timeout_s``), evaluators that finish booting while
    training runs, replacing a failed or hung actor (``max_actor_restarts``, ``actor_restart_delay_s``; a
    replacement that dies before answering is started again), and closing every actor at shutdown
    (``shutdown_timeout_s``, then killed). It counts failures and restarts in the driver's
    :class:`~muzero_tune.distributed.async_driver.AsyncStats`.

A pool degrades rather than dies: a replacement boots while the others work (it takes work once it answers),
one that cannot be placed within ``actor_start_timeout_s`` (its node is gone and no other node has room for
its bundle) is waited for while the run goes on with the slots that live, and is taken back the moment it
starts; a slot whose restarts are exhausted is given up. The run stops only when a kind has no actor left:
none up, and none starting within its deadline.

It knows nothing of what the actors are asked to do: launches, results and their timeouts are the driver's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from muzero_tune.distributed.actors import CollectorWorker, EvaluatorWorker
from muzero_tune.distributed.placement import ActorPlacement, describe_shortfall
from muzero_tune.errors import RunFault

log = logging.getLogger("muzero_tune")


class ActorFailureError(RunFault):
    """A kind of actor has none left (restarts exhausted, or no room to start one again); the run stopped
    (its checkpoints are intact)."""


@dataclass
class ActorSlot:
    """One actor position (collector i or evaluator j) and its current incarnation."""

    kind: str  # "collector" or "evaluator"
    index: int
    bundle: int  # its placement-group bundle
    handle: Any = None  # the Ray actor handle of the current incarnation (None before it is created)
    incarnation: int = 0
    restarts: int = 0
    busy_s: float = 0.0  # seconds of work handed to it so far (the driver adds each launch's)
    # "up": takes work (an evaluator booting at start takes it queued behind its constructor); "starting": a
    # replacement not answering yet; "lost": given up, its restarts exhausted
    state: str = "up"
    start_ping: Any = None  # the replacement's first ping (state "starting")
    start_deadline: float = 0.0  # when a replacement not answering by then counts as waiting for room
    waiting_reported: bool = False
    last_start_error: str = ""
    why: str = ""  # what the last restart replaced


class ActorPool:
    """The collector and evaluator slots of one run (see the module docstring).

    ``ray``: the ``ray`` module or a ``LocalRay``; ``ap``: the resolved ``policy.async_pipeline`` settings;
    ``flat_config``: the run's config as dotted keys (each actor builds its policy from it); ``where()``:
    how far the run got, for the message that stops it when a slot's restarts are exhausted.
    """

    def __init__(
        self,
        ray: Any,
        ap: Any,
        flat_config: dict,
        placement: ActorPlacement | None,
        *,
        stats: Any,
        fault: Any = None,
        where: Callable[[], str] = lambda: "",
        describe_resources: Callable[[], str] = lambda: "",
    ):
        from muzero_tune.envs.factory import creators_for

        self.ray, self.ap, self.flat_config, self.placement = ray, ap, flat_config, placement
        self.env_creators = creators_for(flat_config["env.env_id"])  # an env registered from Python
        self.stats, self.fault, self.where, self.describe_resources = stats, fault, where, describe_resources
        # the Ray actor class of each kind (a benchmark may stand another class in for one)
        self.remote_classes = {
            "collector": ray.remote(CollectorWorker), "evaluator": ray.remote(EvaluatorWorker)
        }
        self.collectors = [ActorSlot("collector", i, 0) for i in range(ap.num_collector_actors)]
        self.evaluators = [ActorSlot("evaluator", j, 0) for j in range(ap.num_evaluator_actors)]
        self.actor_info: list[dict] = []  # ping answers: the collectors, then each evaluator once started
        # evaluators still booting (ping ref -> slot) and the time by which they must have answered
        self.booting: dict[Any, ActorSlot] = {}
        self._start_deadline = 0.0

    @property
    def slots(self) -> list[ActorSlot]:
        return self.collectors + self.evaluators

    # ------------------------------------------------------------------ start-up

    def spawn(self, slot: ActorSlot) -> None:
        """Create the slot's actor (a new incarnation) in its bundle; returns at once, the actor boots on
        its own and gets the current weights with its next launch."""
        ap = self.ap
        collector = slot.kind == "collector"
        cpus = ap.collector_num_cpus if collector else ap.evaluator_num_cpus
        gpus = ap.collector_num_gpus if collector else ap.evaluator_num_gpus
        pl = self.placement
        slot.bundle = pl.collector_bundle(slot.index) if collector else pl.evaluator_bundle(slot.index)
        opts = {"num_cpus": cpus, "num_gpus": gpus, "max_restarts": 0, "max_concurrency": 1,
                **self.placement.options(slot.bundle)}  # fmt: skip
        slot.handle = (
            self.remote_classes[slot.kind]
            .options(**opts)
            .remote(self.flat_config, slot.index, slot.incarnation, self.fault, gpus, self.env_creators)
        )

    def spawn_all(self, slots: list[ActorSlot] | None = None) -> None:
        """Create an actor for each of ``slots`` (default: every slot) that has none yet."""
        for s in self.slots if slots is None else slots:
            if s.handle is None:
                self.spawn(s)

    def start(self, *, wait_for_evaluators: bool, before_wait: Callable[[], None] | None = None) -> None:
        """Create every actor not created yet and wait (up to ``actor_start_timeout_s``) until the collectors
        answer a ping, the evaluators too when ``wait_for_evaluators``; otherwise they finish booting while
        training runs (:meth:`take_started`). ``before_wait`` runs once the actors are created and before
        the wait (the driver queues the run's first launches behind the constructors there)."""
        self.spawn_all()
        booting = [] if wait_for_evaluators else self.evaluators
        pings = [s.handle.ping.remote() for s in self.slots if s not in booting]
        self.booting = {s.handle.ping.remote(): s for s in booting}
        self._start_deadline = time.monotonic() + self.ap.actor_start_timeout_s
        if before_wait is not None:
            before_wait()
        ready, _ = self.ray.wait(pings, num_returns=len(pings), timeout=self.ap.actor_start_timeout_s)
        if len(ready) < len(pings):
            self._raise_not_started(len(ready), len(pings))
        self.actor_info = []  # in slot order: collectors, then evaluators (a lost one answers when restarted)
        for slot, ref in zip([s for s in self.slots if s not in booting], pings):
            self._take_ping(slot, ref)

    def _take_ping(self, slot: ActorSlot, ref: Any) -> bool:
        """Record a starting actor's ping answer; True when it answered. An actor lost while it started (its
        process or node died) is restarted as one lost at work is; an error its own constructor raised (a
        setting, an env that cannot be made) is raised: starting it again would raise it again."""
        try:
            self.actor_info.append(self.ray.get(ref))
            return True
        except Exception as e:
            if not lost_not_raised(e):
                raise
            self.restart(slot, f"lost while starting ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
            return False

    def launch_failed(self, slot: ActorSlot, why: str) -> None:
        """Restart ``slot`` after its launched work failed with ``why``. An evaluator still booting is judged
        by its ping, which answered first (an actor runs its calls in order): a raising constructor is
        raised, a process lost while starting is restarted as such, one that answered and died later as
        lost at work."""
        ping = next((ref for ref, s in self.booting.items() if s is slot), None)
        if ping is not None:
            del self.booting[ping]
            if not self._take_ping(slot, ping):
                return  # restarted as lost while starting
        self.restart(slot, why)

    def take_started(self, timeout: float = 0.0) -> list[ActorSlot]:
        """The booting evaluators that have answered their ping (waiting up to ``timeout``); raises as
        :meth:`start` does when one has not answered by its deadline or failed to start."""
        if not self.booting:
            return []
        ready, _ = self.ray.wait(list(self.booting), num_returns=len(self.booting), timeout=timeout)
        started = []
        for ref in ready:
            slot = self.booting.pop(ref)
            if self._take_ping(slot, ref):  # raises if its constructor did
                started.append(slot)
        if self.booting and time.monotonic() >= self._start_deadline:
            n = len(self.slots)
            self._raise_not_started(n - len(self.booting), n)
        return started

    def _raise_not_started(self, started: int, total: int) -> None:
        raise RuntimeError(
            f"only {started} of {total} actors started within "
            f"{self.ap.actor_start_timeout_s:g} s (policy.async_pipeline.actor_start_timeout_s); "
            f"resources: {self.describe_resources()}"
        )

    # ------------------------------------------------------------------ health

    def up(self, kind: str) -> list[ActorSlot]:
        """The slots of ``kind`` ("collector" or "evaluator") that take work."""
        return [s for s in (self.collectors if kind == "collector" else self.evaluators) if s.state == "up"]

    def restart(self, slot: ActorSlot, why: str) -> None:
        """Replace a failed or hung actor and count it. The replacement boots while the run goes on
        (:meth:`take_restarted` hands it work once it answers); a slot whose restarts are exhausted is given
        up. Raises :class:`ActorFailureError` when that leaves its kind with no actor."""
        st = self.stats
        st.restart_reasons.append(f"{slot.kind} {slot.index}: {why}")
        # an evaluator that failed while booting: its replacement's start is awaited below, not its ping
        self.booting = {ref: s for ref, s in self.booting.items() if s is not slot}
        if slot.kind == "collector":
            st.collector_failures += 1
        else:
            st.evaluator_failures += 1
        self._kill(slot)
        if slot.restarts >= self.ap.max_actor_restarts:
            slot.state, slot.handle = "lost", None
            what = (
                f"{slot.kind} actor {slot.index} failed ({why}) and its restarts are exhausted "
                f"({slot.restarts} of policy.async_pipeline.max_actor_restarts={self.ap.max_actor_restarts})"
            )
            self._stop_if_none_left(slot.kind, what)
            log.warning(f"{what}: the run goes on with {self._left(slot.kind)}")
            return
        slot.restarts += 1
        slot.incarnation += 1
        if slot.kind == "collector":
            st.collector_restarts += 1
        else:
            st.evaluator_restarts += 1
        slot.start_deadline = time.monotonic() + self.ap.actor_restart_delay_s + self.ap.actor_start_timeout_s
        slot.waiting_reported, slot.last_start_error = False, ""
        self._respawn(slot, why)

    def _respawn(self, slot: ActorSlot, why: str) -> None:
        """Start the slot's actor again; it takes work once its first ping answers (its start-up is not
        counted against any launch's timeout)."""
        time.sleep(self.ap.actor_restart_delay_s)
        self.spawn(slot)
        slot.state, slot.start_ping = "starting", slot.handle.ping.remote()
        slot.why = why

    def take_restarted(self) -> list[ActorSlot]:
        """The replacements that answered since the last call, now taking work. One that died before
        answering (placed on a node that was dying too) is started again; one past its deadline is reported
        once and still waited for. Raises :class:`ActorFailureError` when a kind has no actor left."""
        starting = [s for s in self.slots if s.state == "starting"]
        back: list[ActorSlot] = []
        if starting:
            ready, _ = self.ray.wait([s.start_ping for s in starting], num_returns=len(starting), timeout=0)
            answered = set(ready)
            for s in starting:
                if s.start_ping not in answered:
                    continue
                try:
                    self.ray.get(s.start_ping)
                except Exception as e:
                    self.stats.start_retries += 1
                    s.last_start_error = f"; its last start failed: {type(e).__name__}"
                    self._kill(s)
                    if time.monotonic() < s.start_deadline:
                        self._respawn(s, s.why)
                        continue
                    s.state, s.handle = "lost", None  # it cannot start: given up
                    what = f"{s.kind} actor {s.index} could not be started again{s.last_start_error}"
                    self._stop_if_none_left(s.kind, what)
                    log.warning(f"{what}: the run goes on with {self._left(s.kind)}")
                    continue
                s.state, s.start_ping = "up", None
                if s.waiting_reported:
                    log.warning(f"{s.kind} actor {s.index} started again: {self._left(s.kind)} take work")
                back.append(s)
        now = time.monotonic()
        for s in self.slots:
            if s.state == "starting" and now >= s.start_deadline:
                self._stop_if_none_left(
                    s.kind,
                    f"{s.kind} actor {s.index} was restarted ({s.why}) but did not start within "
                    f"{self.ap.actor_start_timeout_s:g} s (policy.async_pipeline.actor_start_timeout_s)"
                    f"{s.last_start_error}",
                )
                if not s.waiting_reported:
                    s.waiting_reported = True
                    log.warning(
                        f"{s.kind} actor {s.index} did not start again within "
                        f"{self.ap.actor_start_timeout_s:g} s (no room for its bundle: "
                        f"{self.describe_resources()}); the run goes on with {self._left(s.kind)} and takes "
                        f"it back when it starts"
                    )
        return back

    def _left(self, kind: str) -> str:
        total = len(self.collectors if kind == "collector" else self.evaluators)
        return f"{len(self.up(kind))} of {total} {kind}s"

    def _stop_if_none_left(self, kind: str, what: str) -> None:
        """Raise :class:`ActorFailureError` when ``kind`` has no actor up and none starting within its
        deadline."""
        now = time.monotonic()
        slots = self.collectors if kind == "collector" else self.evaluators
        if any(s.state == "up" or (s.state == "starting" and now < s.start_deadline) for s in slots):
            return
        raise ActorFailureError(
            f"{what}; no {kind} actor is left, so the run stopped at {self.where()}; its last checkpoint is "
            f"intact"
        )

    def _kill(self, slot: ActorSlot) -> None:
        try:
            self.ray.kill(slot.handle, no_restart=True)
        except Exception:  # already dead
            pass

    # ------------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        """Ask every actor that is up to close, wait up to ``shutdown_timeout_s``, then kill them all (a
        replacement still starting, e.g. one with no room for its bundle, is killed without asking: a close
        queued behind a constructor that never runs would only wait out the timeout)."""
        t0 = time.monotonic()
        slots = [s for s in self.slots if s.handle is not None and s.state != "lost"]
        refs = []
        for s in slots:
            if s.state == "starting":
                continue
            try:
                refs.append(s.handle.close.remote())
            except Exception:
                pass
        if refs:
            self.ray.wait(refs, num_returns=len(refs), timeout=self.ap.shutdown_timeout_s)
        for s in slots:
            self._kill(s)
        self.stats.shutdown_s = time.monotonic() - t0


def lost_not_raised(err: BaseException) -> bool:
    """True for an actor lost to its process or its node dying (Ray's system failures), False for an error
    raised by the actor's own code (its constructor or a method)."""
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # no Ray: a local pool's actors are objects in this process, never lost
        return False
    return isinstance(err, RayActorError) and not err.actor_init_failed


def resource_shortfall(cfg) -> str:
    """What the run's bundles ask for against what the cluster has (for start-up errors)."""
    from muzero_tune.distributed.placement import bundles

    return describe_shortfall(bundles(cfg))
